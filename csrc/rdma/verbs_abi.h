// The part of the libibverbs ABI that rcoll uses, declared here so that the
// build never needs rdma-core's headers: every build, wheel or source install,
// carries the verbs transport, and libibverbs is loaded at run time
// (ibverbs_loader.cc).
//
// These are rcoll's own declarations of a stable binary interface (the layouts
// libibverbs.so.1 has kept since its IBVERBS_1.1 symbol version), written from
// the interface's documentation, in namespace rcoll so that they can sit beside
// rdma-core's <infiniband/verbs.h> in one translation unit.
// tests/native/cpp/test_verbs_abi.cc compiles both and checks every size, offset and
// constant below against rdma-core's; CI runs it.
//
// Two kinds of structures:
// - Those rcoll allocates and the library reads or fills (attributes, work
//   requests, completions, scatter entries) are declared whole: their size is
//   part of the ABI. ibv_port_attr and ibv_device_attr are only written by the
//   library, so they may be larger than an older library's.
// - Those the library allocates and rcoll only points to (device, context, CQ,
//   QP, PD, MR, completion channel) declare just the leading fields rcoll reads;
//   they are never created, copied or sized on rcoll's side.
//
// The data-path calls (post_send, post_recv, poll_cq, req_notify_cq) are not
// exported symbols: they go through the provider's table of operations in the
// context, as rdma-core's inline functions do; postSend() and friends below.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rcoll {

// --- constants ---------------------------------------------------------------

enum ibv_mtu { IBV_MTU_256 = 1, IBV_MTU_512 = 2, IBV_MTU_1024 = 3, IBV_MTU_2048 = 4, IBV_MTU_4096 = 5 };

enum ibv_port_state {
  IBV_PORT_NOP = 0,
  IBV_PORT_DOWN = 1,
  IBV_PORT_INIT = 2,
  IBV_PORT_ARMED = 3,
  IBV_PORT_ACTIVE = 4,
  IBV_PORT_ACTIVE_DEFER = 5,
};

// ibv_port_attr::link_layer (a uint8_t there, so plain constants).
constexpr uint8_t IBV_LINK_LAYER_UNSPECIFIED = 0;
constexpr uint8_t IBV_LINK_LAYER_INFINIBAND = 1;
constexpr uint8_t IBV_LINK_LAYER_ETHERNET = 2;

enum ibv_gid_type { IBV_GID_TYPE_IB = 0, IBV_GID_TYPE_ROCE_V1 = 1, IBV_GID_TYPE_ROCE_V2 = 2 };

enum ibv_access_flags {
  IBV_ACCESS_LOCAL_WRITE = 1,
  IBV_ACCESS_REMOTE_WRITE = 1 << 1,
  IBV_ACCESS_REMOTE_READ = 1 << 2,
  IBV_ACCESS_REMOTE_ATOMIC = 1 << 3,
};

enum ibv_qp_type { IBV_QPT_RC = 2, IBV_QPT_UC = 3, IBV_QPT_UD = 4 };

enum ibv_qp_state {
  IBV_QPS_RESET = 0,
  IBV_QPS_INIT = 1,
  IBV_QPS_RTR = 2,
  IBV_QPS_RTS = 3,
  IBV_QPS_SQD = 4,
  IBV_QPS_SQE = 5,
  IBV_QPS_ERR = 6,
  IBV_QPS_UNKNOWN = 7,
};

enum ibv_mig_state { IBV_MIG_MIGRATED = 0, IBV_MIG_REARM = 1, IBV_MIG_ARMED = 2 };

// The bits of ibv_modify_qp's attribute mask.
enum ibv_qp_attr_mask {
  IBV_QP_STATE = 1 << 0,
  IBV_QP_CUR_STATE = 1 << 1,
  IBV_QP_EN_SQD_ASYNC_NOTIFY = 1 << 2,
  IBV_QP_ACCESS_FLAGS = 1 << 3,
  IBV_QP_PKEY_INDEX = 1 << 4,
  IBV_QP_PORT = 1 << 5,
  IBV_QP_QKEY = 1 << 6,
  IBV_QP_AV = 1 << 7,
  IBV_QP_PATH_MTU = 1 << 8,
  IBV_QP_TIMEOUT = 1 << 9,
  IBV_QP_RETRY_CNT = 1 << 10,
  IBV_QP_RNR_RETRY = 1 << 11,
  IBV_QP_RQ_PSN = 1 << 12,
  IBV_QP_MAX_QP_RD_ATOMIC = 1 << 13,
  IBV_QP_ALT_PATH = 1 << 14,
  IBV_QP_MIN_RNR_TIMER = 1 << 15,
  IBV_QP_SQ_PSN = 1 << 16,
  IBV_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
  IBV_QP_PATH_MIG_STATE = 1 << 18,
  IBV_QP_CAP = 1 << 19,
  IBV_QP_DEST_QPN = 1 << 20,
};

enum ibv_wr_opcode {
  IBV_WR_RDMA_WRITE = 0,
  IBV_WR_RDMA_WRITE_WITH_IMM = 1,
  IBV_WR_SEND = 2,
  IBV_WR_SEND_WITH_IMM = 3,
  IBV_WR_RDMA_READ = 4,
};

enum ibv_send_flags {
  IBV_SEND_FENCE = 1,
  IBV_SEND_SIGNALED = 1 << 1,
  IBV_SEND_SOLICITED = 1 << 2,
  IBV_SEND_INLINE = 1 << 3,
};

enum ibv_wc_status {
  IBV_WC_SUCCESS = 0,
  IBV_WC_LOC_LEN_ERR = 1,
  IBV_WC_LOC_QP_OP_ERR = 2,
  IBV_WC_LOC_EEC_OP_ERR = 3,
  IBV_WC_LOC_PROT_ERR = 4,
  IBV_WC_WR_FLUSH_ERR = 5,
  IBV_WC_MW_BIND_ERR = 6,
  IBV_WC_BAD_RESP_ERR = 7,
  IBV_WC_LOC_ACCESS_ERR = 8,
  IBV_WC_REM_INV_REQ_ERR = 9,
  IBV_WC_REM_ACCESS_ERR = 10,
  IBV_WC_REM_OP_ERR = 11,
  IBV_WC_RETRY_EXC_ERR = 12,
  IBV_WC_RNR_RETRY_EXC_ERR = 13,
};

enum ibv_wc_opcode {
  IBV_WC_SEND = 0,
  IBV_WC_RDMA_WRITE = 1,
  IBV_WC_RDMA_READ = 2,
  IBV_WC_RECV = 1 << 7,  // receive completions have this bit
  IBV_WC_RECV_RDMA_WITH_IMM = (1 << 7) + 1,
};

// --- structures rcoll allocates (whole) --------------------------------------

union ibv_gid {
  uint8_t raw[16];
  struct {
    uint64_t subnet_prefix;  // big-endian on the wire, as is interface_id
    uint64_t interface_id;
  } global;
};

struct ibv_gid_entry {
  ibv_gid gid;
  uint32_t gid_index;
  uint32_t port_num;
  uint32_t gid_type;  // ibv_gid_type
  uint32_t ndev_ifindex;
};

struct ibv_device_attr {
  char fw_ver[64];
  uint64_t node_guid;       // big-endian
  uint64_t sys_image_guid;  // big-endian
  uint64_t max_mr_size;
  uint64_t page_size_cap;
  uint32_t vendor_id;
  uint32_t vendor_part_id;
  uint32_t hw_ver;
  int max_qp;
  int max_qp_wr;
  unsigned int device_cap_flags;
  int max_sge;
  int max_sge_rd;
  int max_cq;
  int max_cqe;
  int max_mr;
  int max_pd;
  int max_qp_rd_atom;
  int max_ee_rd_atom;
  int max_res_rd_atom;
  int max_qp_init_rd_atom;
  int max_ee_init_rd_atom;
  int atomic_cap;  // enum ibv_atomic_cap
  int max_ee;
  int max_rdd;
  int max_mw;
  int max_raw_ipv6_qp;
  int max_raw_ethy_qp;
  int max_mcast_grp;
  int max_mcast_qp_attach;
  int max_total_mcast_qp_attach;
  int max_ah;
  int max_fmr;
  int max_map_per_fmr;
  int max_srq;
  int max_srq_wr;
  int max_srq_sge;
  uint16_t max_pkeys;
  uint8_t local_ca_ack_delay;
  uint8_t phys_port_cnt;
};

struct ibv_port_attr {
  ibv_port_state state;
  ibv_mtu max_mtu;
  ibv_mtu active_mtu;
  int gid_tbl_len;
  uint32_t port_cap_flags;
  uint32_t max_msg_sz;
  uint32_t bad_pkey_cntr;
  uint32_t qkey_viol_cntr;
  uint16_t pkey_tbl_len;
  uint16_t lid;
  uint16_t sm_lid;
  uint8_t lmc;
  uint8_t max_vl_num;
  uint8_t sm_sl;
  uint8_t subnet_timeout;
  uint8_t init_type_reply;
  uint8_t active_width;
  uint8_t active_speed;
  uint8_t phys_state;
  uint8_t link_layer;
  uint8_t flags;
  uint16_t port_cap_flags2;
  uint32_t active_speed_ex;  // newer libraries; room for it costs nothing with older ones
};

struct ibv_qp_cap {
  uint32_t max_send_wr;
  uint32_t max_recv_wr;
  uint32_t max_send_sge;
  uint32_t max_recv_sge;
  uint32_t max_inline_data;
};

struct ibv_global_route {
  ibv_gid dgid;
  uint32_t flow_label;
  uint8_t sgid_index;
  uint8_t hop_limit;
  uint8_t traffic_class;
};

struct ibv_ah_attr {
  ibv_global_route grh;
  uint16_t dlid;
  uint8_t sl;
  uint8_t src_path_bits;
  uint8_t static_rate;
  uint8_t is_global;
  uint8_t port_num;
};

struct ibv_qp_attr {
  ibv_qp_state qp_state;
  ibv_qp_state cur_qp_state;
  ibv_mtu path_mtu;
  ibv_mig_state path_mig_state;
  uint32_t qkey;
  uint32_t rq_psn;
  uint32_t sq_psn;
  uint32_t dest_qp_num;
  unsigned int qp_access_flags;
  ibv_qp_cap cap;
  ibv_ah_attr ah_attr;
  ibv_ah_attr alt_ah_attr;
  uint16_t pkey_index;
  uint16_t alt_pkey_index;
  uint8_t en_sqd_async_notify;
  uint8_t sq_draining;
  uint8_t max_rd_atomic;
  uint8_t max_dest_rd_atomic;
  uint8_t min_rnr_timer;
  uint8_t port_num;
  uint8_t timeout;
  uint8_t retry_cnt;
  uint8_t rnr_retry;
  uint8_t alt_port_num;
  uint8_t alt_timeout;
  uint32_t rate_limit;
};

struct ibv_cq;
struct ibv_srq;
struct ibv_qp;
struct ibv_mr;
struct ibv_mw;
struct ibv_ah;

struct ibv_qp_init_attr {
  void* qp_context;
  ibv_cq* send_cq;
  ibv_cq* recv_cq;
  ibv_srq* srq;
  ibv_qp_cap cap;
  ibv_qp_type qp_type;
  int sq_sig_all;
};

struct ibv_sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

struct ibv_recv_wr {
  uint64_t wr_id;
  ibv_recv_wr* next;
  ibv_sge* sg_list;
  int num_sge;
};

struct ibv_send_wr {
  uint64_t wr_id;
  ibv_send_wr* next;
  ibv_sge* sg_list;
  int num_sge;
  ibv_wr_opcode opcode;
  unsigned int send_flags;
  union {
    uint32_t imm_data;  // big-endian
    uint32_t invalidate_rkey;
  };
  union {
    struct {
      uint64_t remote_addr;
      uint32_t rkey;
    } rdma;
    struct {
      uint64_t remote_addr;
      uint64_t compare_add;
      uint64_t swap;
      uint32_t rkey;
    } atomic;
    struct {
      ibv_ah* ah;
      uint32_t remote_qpn;
      uint32_t remote_qkey;
    } ud;
  } wr;
  union {
    struct {
      uint32_t remote_srqn;
    } xrc;
  } qp_type;
  // Memory-window binding or TCP segmentation offload; unused by rcoll, but
  // part of the size the provider expects.
  union {
    struct {
      ibv_mw* mw;
      uint32_t rkey;
      struct {
        ibv_mr* mr;
        uint64_t addr;
        uint64_t length;
        unsigned int mw_access_flags;
      } bind_info;
    } bind_mw;
    struct {
      void* hdr;
      uint16_t hdr_sz;
      uint16_t mss;
    } tso;
  };
};

struct ibv_wc {
  uint64_t wr_id;
  ibv_wc_status status;
  ibv_wc_opcode opcode;
  uint32_t vendor_err;
  uint32_t byte_len;
  union {
    uint32_t imm_data;  // big-endian
    uint32_t invalidated_rkey;
  };
  uint32_t qp_num;
  uint32_t src_qp;
  unsigned int wc_flags;
  uint16_t pkey_index;
  uint16_t slid;
  uint8_t sl;
  uint8_t dlid_path_bits;
};

// --- structures the library allocates (leading fields only) ------------------

struct ibv_device;
struct ibv_pd;

// The provider's operations, as the context carries them. Only the data-path
// entries are called; the others are placeholders that keep the offsets (many
// are compatibility slots the library no longer fills).
struct ibv_context_ops {
  void* unused_query_device;
  void* unused_query_port;
  void* unused_alloc_pd;
  void* unused_dealloc_pd;
  void* unused_reg_mr;
  void* unused_rereg_mr;
  void* unused_dereg_mr;
  void* unused_alloc_mw;
  void* unused_bind_mw;
  void* unused_dealloc_mw;
  void* unused_create_cq;
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc);
  int (*req_notify_cq)(ibv_cq* cq, int solicited_only);
  void* unused_cq_event;
  void* unused_resize_cq;
  void* unused_destroy_cq;
  void* unused_create_srq;
  void* unused_modify_srq;
  void* unused_query_srq;
  void* unused_destroy_srq;
  void* unused_post_srq_recv;
  void* unused_create_qp;
  void* unused_query_qp;
  void* unused_modify_qp;
  void* unused_destroy_qp;
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
  void* unused_create_ah;  // the rest, so that ibv_context's fields after the table sit where the library has them
  void* unused_destroy_ah;
  void* unused_attach_mcast;
  void* unused_detach_mcast;
  void* unused_async_event;
};

struct ibv_context {
  ibv_device* device;
  ibv_context_ops ops;
  int cmd_fd;
  int async_fd;  // readable when an async event (a port going down, ...) is queued
};

// Async events (ibv_get_async_event): the ones rcoll acts on.
enum ibv_event_type : unsigned int {  // rdma-core's has 20 values, 0 to 19: room for all of them
  IBV_EVENT_DEVICE_FATAL = 8,
  IBV_EVENT_PORT_ACTIVE = 9,
  IBV_EVENT_PORT_ERR = 10,
};

struct ibv_async_event {
  union {
    ibv_cq* cq;
    ibv_qp* qp;
    void* srq;
    void* wq;
    int port_num;
  } element;
  ibv_event_type event_type;
};

struct ibv_comp_channel {
  ibv_context* context;
  int fd;  // readable when a completion event is queued
};

struct ibv_cq {
  ibv_context* context;
};

struct ibv_qp {
  ibv_context* context;
  void* qp_context;
  ibv_pd* pd;
  ibv_cq* send_cq;
  ibv_cq* recv_cq;
  ibv_srq* srq;
  uint32_t handle;
  uint32_t qp_num;
};

struct ibv_mr {
  ibv_context* context;
  ibv_pd* pd;
  void* addr;
  size_t length;
  uint32_t handle;
  uint32_t lkey;
  uint32_t rkey;
};

// --- the data path, through the provider's operations ------------------------

inline int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  return qp->context->ops.post_send(qp, wr, bad_wr);
}

inline int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  return qp->context->ops.post_recv(qp, wr, bad_wr);
}

inline int pollCq(ibv_cq* cq, int num_entries, ibv_wc* wc) { return cq->context->ops.poll_cq(cq, num_entries, wc); }

inline int reqNotifyCq(ibv_cq* cq, int solicited_only) { return cq->context->ops.req_notify_cq(cq, solicited_only); }

}  // namespace rcoll
