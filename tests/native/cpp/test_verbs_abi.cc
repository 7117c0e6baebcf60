// rcoll's own declarations of the verbs ABI (csrc/rdma/verbs_abi.h) against
// rdma-core's <infiniband/verbs.h>: every constant, every structure size and
// every field offset and size rcoll declares must be the library's. The checks
// are static_asserts, so a mismatch fails the build of this file with the name
// of what differs; the program itself only reports what it checked.
//
// rcoll's declarations live in namespace rcoll, rdma-core's in the global one,
// so both are visible here side by side.
#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdio>
#include <utility>

#include "rdma/verbs_abi.h"

namespace {

int checked = 0;

}  // namespace

// The same value for a constant.
#define SAME_VALUE(name)                                                               \
  static_assert(static_cast<long long>(::name) == static_cast<long long>(rcoll::name), \
                "verbs_abi.h: " #name " differs from rdma-core's");                    \
  ++checked

// The same size for a structure rcoll allocates and the library reads.
#define SAME_SIZE(type)                                                                             \
  static_assert(sizeof(::type) == sizeof(rcoll::type), "verbs_abi.h: sizeof " #type " differs");    \
  static_assert(alignof(::type) == alignof(rcoll::type), "verbs_abi.h: alignof " #type " differs"); \
  ++checked

// Room for at least what the library writes (structures it only fills).
#define ROOM_FOR(type)                                                                                        \
  static_assert(sizeof(::type) <= sizeof(rcoll::type), "verbs_abi.h: " #type " is smaller than rdma-core's"); \
  ++checked

// The same offset and size for a field.
#define SAME_FIELD(type, field)                                                                    \
  static_assert(offsetof(::type, field) == offsetof(rcoll::type, field),                           \
                "verbs_abi.h: offset of " #type "::" #field " differs");                           \
  static_assert(sizeof(std::declval<::type>().field) == sizeof(std::declval<rcoll::type>().field), \
                "verbs_abi.h: size of " #type "::" #field " differs");                             \
  ++checked

// The same offset only: a table rcoll declares the leading entries of.
#define SAME_OFFSET(type, field)                                         \
  static_assert(offsetof(::type, field) == offsetof(rcoll::type, field), \
                "verbs_abi.h: offset of " #type "::" #field " differs"); \
  ++checked

int main() {
  // Constants.
  SAME_VALUE(IBV_MTU_256);
  SAME_VALUE(IBV_MTU_512);
  SAME_VALUE(IBV_MTU_1024);
  SAME_VALUE(IBV_MTU_2048);
  SAME_VALUE(IBV_MTU_4096);
  SAME_VALUE(IBV_PORT_NOP);
  SAME_VALUE(IBV_PORT_DOWN);
  SAME_VALUE(IBV_PORT_INIT);
  SAME_VALUE(IBV_PORT_ARMED);
  SAME_VALUE(IBV_PORT_ACTIVE);
  SAME_VALUE(IBV_PORT_ACTIVE_DEFER);
  SAME_VALUE(IBV_LINK_LAYER_UNSPECIFIED);
  SAME_VALUE(IBV_LINK_LAYER_INFINIBAND);
  SAME_VALUE(IBV_LINK_LAYER_ETHERNET);
  SAME_VALUE(IBV_GID_TYPE_IB);
  SAME_VALUE(IBV_GID_TYPE_ROCE_V1);
  SAME_VALUE(IBV_GID_TYPE_ROCE_V2);
  SAME_VALUE(IBV_ACCESS_LOCAL_WRITE);
  SAME_VALUE(IBV_ACCESS_REMOTE_WRITE);
  SAME_VALUE(IBV_ACCESS_REMOTE_READ);
  SAME_VALUE(IBV_ACCESS_REMOTE_ATOMIC);
  SAME_VALUE(IBV_QPT_RC);
  SAME_VALUE(IBV_QPT_UC);
  SAME_VALUE(IBV_QPT_UD);
  SAME_VALUE(IBV_QPS_RESET);
  SAME_VALUE(IBV_QPS_INIT);
  SAME_VALUE(IBV_QPS_RTR);
  SAME_VALUE(IBV_QPS_RTS);
  SAME_VALUE(IBV_QPS_SQD);
  SAME_VALUE(IBV_QPS_SQE);
  SAME_VALUE(IBV_QPS_ERR);
  SAME_VALUE(IBV_QPS_UNKNOWN);
  SAME_VALUE(IBV_MIG_MIGRATED);
  SAME_VALUE(IBV_MIG_REARM);
  SAME_VALUE(IBV_MIG_ARMED);
  SAME_VALUE(IBV_QP_STATE);
  SAME_VALUE(IBV_QP_CUR_STATE);
  SAME_VALUE(IBV_QP_EN_SQD_ASYNC_NOTIFY);
  SAME_VALUE(IBV_QP_ACCESS_FLAGS);
  SAME_VALUE(IBV_QP_PKEY_INDEX);
  SAME_VALUE(IBV_QP_PORT);
  SAME_VALUE(IBV_QP_QKEY);
  SAME_VALUE(IBV_QP_AV);
  SAME_VALUE(IBV_QP_PATH_MTU);
  SAME_VALUE(IBV_QP_TIMEOUT);
  SAME_VALUE(IBV_QP_RETRY_CNT);
  SAME_VALUE(IBV_QP_RNR_RETRY);
  SAME_VALUE(IBV_QP_RQ_PSN);
  SAME_VALUE(IBV_QP_MAX_QP_RD_ATOMIC);
  SAME_VALUE(IBV_QP_ALT_PATH);
  SAME_VALUE(IBV_QP_MIN_RNR_TIMER);
  SAME_VALUE(IBV_QP_SQ_PSN);
  SAME_VALUE(IBV_QP_MAX_DEST_RD_ATOMIC);
  SAME_VALUE(IBV_QP_PATH_MIG_STATE);
  SAME_VALUE(IBV_QP_CAP);
  SAME_VALUE(IBV_QP_DEST_QPN);
  SAME_VALUE(IBV_WR_RDMA_WRITE);
  SAME_VALUE(IBV_WR_RDMA_WRITE_WITH_IMM);
  SAME_VALUE(IBV_WR_SEND);
  SAME_VALUE(IBV_WR_SEND_WITH_IMM);
  SAME_VALUE(IBV_WR_RDMA_READ);
  SAME_VALUE(IBV_SEND_FENCE);
  SAME_VALUE(IBV_SEND_SIGNALED);
  SAME_VALUE(IBV_SEND_SOLICITED);
  SAME_VALUE(IBV_SEND_INLINE);
  SAME_VALUE(IBV_WC_SUCCESS);
  SAME_VALUE(IBV_WC_LOC_LEN_ERR);
  SAME_VALUE(IBV_WC_LOC_QP_OP_ERR);
  SAME_VALUE(IBV_WC_LOC_EEC_OP_ERR);
  SAME_VALUE(IBV_WC_LOC_PROT_ERR);
  SAME_VALUE(IBV_WC_WR_FLUSH_ERR);
  SAME_VALUE(IBV_WC_MW_BIND_ERR);
  SAME_VALUE(IBV_WC_BAD_RESP_ERR);
  SAME_VALUE(IBV_WC_LOC_ACCESS_ERR);
  SAME_VALUE(IBV_WC_REM_INV_REQ_ERR);
  SAME_VALUE(IBV_WC_REM_ACCESS_ERR);
  SAME_VALUE(IBV_WC_REM_OP_ERR);
  SAME_VALUE(IBV_WC_RETRY_EXC_ERR);
  SAME_VALUE(IBV_WC_RNR_RETRY_EXC_ERR);
  SAME_VALUE(IBV_WC_SEND);
  SAME_VALUE(IBV_WC_RDMA_WRITE);
  SAME_VALUE(IBV_WC_RDMA_READ);
  SAME_VALUE(IBV_WC_RECV);
  SAME_VALUE(IBV_WC_RECV_RDMA_WITH_IMM);
  // Enumerations stored in structures keep their size.
  static_assert(sizeof(::ibv_mtu) == sizeof(rcoll::ibv_mtu), "enum size");
  static_assert(sizeof(::ibv_qp_state) == sizeof(rcoll::ibv_qp_state), "enum size");
  static_assert(sizeof(::ibv_wc_status) == sizeof(rcoll::ibv_wc_status), "enum size");
  static_assert(sizeof(::ibv_wc_opcode) == sizeof(rcoll::ibv_wc_opcode), "enum size");
  static_assert(sizeof(::ibv_wr_opcode) == sizeof(rcoll::ibv_wr_opcode), "enum size");

  // Structures rcoll allocates: the whole layout.
  SAME_SIZE(ibv_gid);
  SAME_FIELD(ibv_gid, raw);
  SAME_FIELD(ibv_gid, global.subnet_prefix);
  SAME_FIELD(ibv_gid, global.interface_id);

  SAME_SIZE(ibv_gid_entry);
  SAME_FIELD(ibv_gid_entry, gid);
  SAME_FIELD(ibv_gid_entry, gid_index);
  SAME_FIELD(ibv_gid_entry, port_num);
  SAME_FIELD(ibv_gid_entry, gid_type);
  SAME_FIELD(ibv_gid_entry, ndev_ifindex);

  SAME_SIZE(ibv_device_attr);
  SAME_FIELD(ibv_device_attr, fw_ver);
  SAME_FIELD(ibv_device_attr, node_guid);
  SAME_FIELD(ibv_device_attr, max_mr_size);
  SAME_FIELD(ibv_device_attr, vendor_id);
  SAME_FIELD(ibv_device_attr, vendor_part_id);
  SAME_FIELD(ibv_device_attr, max_qp);
  SAME_FIELD(ibv_device_attr, max_qp_wr);
  SAME_FIELD(ibv_device_attr, device_cap_flags);
  SAME_FIELD(ibv_device_attr, max_sge);
  SAME_FIELD(ibv_device_attr, max_cq);
  SAME_FIELD(ibv_device_attr, max_cqe);
  SAME_FIELD(ibv_device_attr, max_mr);
  SAME_FIELD(ibv_device_attr, max_qp_rd_atom);
  SAME_FIELD(ibv_device_attr, max_qp_init_rd_atom);
  SAME_FIELD(ibv_device_attr, atomic_cap);
  SAME_FIELD(ibv_device_attr, max_srq_sge);
  SAME_FIELD(ibv_device_attr, max_pkeys);
  SAME_FIELD(ibv_device_attr, local_ca_ack_delay);
  SAME_FIELD(ibv_device_attr, phys_port_cnt);

  ROOM_FOR(ibv_port_attr);
  SAME_FIELD(ibv_port_attr, state);
  SAME_FIELD(ibv_port_attr, max_mtu);
  SAME_FIELD(ibv_port_attr, active_mtu);
  SAME_FIELD(ibv_port_attr, gid_tbl_len);
  SAME_FIELD(ibv_port_attr, port_cap_flags);
  SAME_FIELD(ibv_port_attr, max_msg_sz);
  SAME_FIELD(ibv_port_attr, pkey_tbl_len);
  SAME_FIELD(ibv_port_attr, lid);
  SAME_FIELD(ibv_port_attr, sm_lid);
  SAME_FIELD(ibv_port_attr, active_width);
  SAME_FIELD(ibv_port_attr, active_speed);
  SAME_FIELD(ibv_port_attr, phys_state);
  SAME_FIELD(ibv_port_attr, link_layer);
  SAME_FIELD(ibv_port_attr, flags);
  SAME_FIELD(ibv_port_attr, port_cap_flags2);

  SAME_SIZE(ibv_qp_cap);
  SAME_FIELD(ibv_qp_cap, max_send_wr);
  SAME_FIELD(ibv_qp_cap, max_recv_wr);
  SAME_FIELD(ibv_qp_cap, max_send_sge);
  SAME_FIELD(ibv_qp_cap, max_recv_sge);
  SAME_FIELD(ibv_qp_cap, max_inline_data);

  SAME_SIZE(ibv_global_route);
  SAME_FIELD(ibv_global_route, dgid);
  SAME_FIELD(ibv_global_route, flow_label);
  SAME_FIELD(ibv_global_route, sgid_index);
  SAME_FIELD(ibv_global_route, hop_limit);
  SAME_FIELD(ibv_global_route, traffic_class);

  SAME_SIZE(ibv_ah_attr);
  SAME_FIELD(ibv_ah_attr, grh);
  SAME_FIELD(ibv_ah_attr, dlid);
  SAME_FIELD(ibv_ah_attr, sl);
  SAME_FIELD(ibv_ah_attr, src_path_bits);
  SAME_FIELD(ibv_ah_attr, static_rate);
  SAME_FIELD(ibv_ah_attr, is_global);
  SAME_FIELD(ibv_ah_attr, port_num);

  SAME_SIZE(ibv_qp_attr);
  SAME_FIELD(ibv_qp_attr, qp_state);
  SAME_FIELD(ibv_qp_attr, cur_qp_state);
  SAME_FIELD(ibv_qp_attr, path_mtu);
  SAME_FIELD(ibv_qp_attr, path_mig_state);
  SAME_FIELD(ibv_qp_attr, qkey);
  SAME_FIELD(ibv_qp_attr, rq_psn);
  SAME_FIELD(ibv_qp_attr, sq_psn);
  SAME_FIELD(ibv_qp_attr, dest_qp_num);
  SAME_FIELD(ibv_qp_attr, qp_access_flags);
  SAME_FIELD(ibv_qp_attr, cap);
  SAME_FIELD(ibv_qp_attr, ah_attr);
  SAME_FIELD(ibv_qp_attr, alt_ah_attr);
  SAME_FIELD(ibv_qp_attr, pkey_index);
  SAME_FIELD(ibv_qp_attr, alt_pkey_index);
  SAME_FIELD(ibv_qp_attr, en_sqd_async_notify);
  SAME_FIELD(ibv_qp_attr, sq_draining);
  SAME_FIELD(ibv_qp_attr, max_rd_atomic);
  SAME_FIELD(ibv_qp_attr, max_dest_rd_atomic);
  SAME_FIELD(ibv_qp_attr, min_rnr_timer);
  SAME_FIELD(ibv_qp_attr, port_num);
  SAME_FIELD(ibv_qp_attr, timeout);
  SAME_FIELD(ibv_qp_attr, retry_cnt);
  SAME_FIELD(ibv_qp_attr, rnr_retry);
  SAME_FIELD(ibv_qp_attr, alt_port_num);
  SAME_FIELD(ibv_qp_attr, alt_timeout);
  SAME_FIELD(ibv_qp_attr, rate_limit);

  SAME_SIZE(ibv_qp_init_attr);
  SAME_FIELD(ibv_qp_init_attr, qp_context);
  SAME_FIELD(ibv_qp_init_attr, send_cq);
  SAME_FIELD(ibv_qp_init_attr, recv_cq);
  SAME_FIELD(ibv_qp_init_attr, srq);
  SAME_FIELD(ibv_qp_init_attr, cap);
  SAME_FIELD(ibv_qp_init_attr, qp_type);
  SAME_FIELD(ibv_qp_init_attr, sq_sig_all);

  SAME_SIZE(ibv_sge);
  SAME_FIELD(ibv_sge, addr);
  SAME_FIELD(ibv_sge, length);
  SAME_FIELD(ibv_sge, lkey);

  SAME_SIZE(ibv_recv_wr);
  SAME_FIELD(ibv_recv_wr, wr_id);
  SAME_FIELD(ibv_recv_wr, next);
  SAME_FIELD(ibv_recv_wr, sg_list);
  SAME_FIELD(ibv_recv_wr, num_sge);

  SAME_SIZE(ibv_send_wr);
  SAME_FIELD(ibv_send_wr, wr_id);
  SAME_FIELD(ibv_send_wr, next);
  SAME_FIELD(ibv_send_wr, sg_list);
  SAME_FIELD(ibv_send_wr, num_sge);
  SAME_FIELD(ibv_send_wr, opcode);
  SAME_FIELD(ibv_send_wr, send_flags);
  SAME_FIELD(ibv_send_wr, imm_data);
  SAME_FIELD(ibv_send_wr, invalidate_rkey);
  SAME_FIELD(ibv_send_wr, wr.rdma.remote_addr);
  SAME_FIELD(ibv_send_wr, wr.rdma.rkey);
  SAME_FIELD(ibv_send_wr, wr.atomic.rkey);
  SAME_FIELD(ibv_send_wr, wr.ud.remote_qkey);
  SAME_FIELD(ibv_send_wr, qp_type.xrc.remote_srqn);
  SAME_FIELD(ibv_send_wr, bind_mw.bind_info.mw_access_flags);
  SAME_FIELD(ibv_send_wr, tso.mss);

  SAME_SIZE(ibv_wc);
  SAME_FIELD(ibv_wc, wr_id);
  SAME_FIELD(ibv_wc, status);
  SAME_FIELD(ibv_wc, opcode);
  SAME_FIELD(ibv_wc, vendor_err);
  SAME_FIELD(ibv_wc, byte_len);
  SAME_FIELD(ibv_wc, imm_data);
  SAME_FIELD(ibv_wc, invalidated_rkey);
  SAME_FIELD(ibv_wc, qp_num);
  SAME_FIELD(ibv_wc, src_qp);
  SAME_FIELD(ibv_wc, wc_flags);
  SAME_FIELD(ibv_wc, pkey_index);
  SAME_FIELD(ibv_wc, slid);
  SAME_FIELD(ibv_wc, sl);
  SAME_FIELD(ibv_wc, dlid_path_bits);

  // Structures the library allocates: the leading fields rcoll reads.
  SAME_FIELD(ibv_context_ops, poll_cq);
  SAME_FIELD(ibv_context_ops, req_notify_cq);
  SAME_FIELD(ibv_context_ops, post_send);
  SAME_FIELD(ibv_context_ops, post_recv);
  SAME_FIELD(ibv_context, device);
  SAME_FIELD(ibv_context, ops);
  SAME_FIELD(ibv_context, async_fd);
  SAME_VALUE(IBV_EVENT_DEVICE_FATAL);
  SAME_VALUE(IBV_EVENT_PORT_ACTIVE);
  SAME_VALUE(IBV_EVENT_PORT_ERR);
  SAME_SIZE(ibv_event_type);
  SAME_SIZE(ibv_async_event);
  SAME_FIELD(ibv_async_event, element);
  SAME_FIELD(ibv_async_event, event_type);
  SAME_FIELD(ibv_comp_channel, context);
  SAME_FIELD(ibv_comp_channel, fd);
  SAME_FIELD(ibv_cq, context);
  SAME_FIELD(ibv_qp, context);
  SAME_FIELD(ibv_qp, qp_context);
  SAME_FIELD(ibv_qp, pd);
  SAME_FIELD(ibv_qp, send_cq);
  SAME_FIELD(ibv_qp, recv_cq);
  SAME_FIELD(ibv_qp, srq);
  SAME_FIELD(ibv_qp, handle);
  SAME_FIELD(ibv_qp, qp_num);
  SAME_FIELD(ibv_mr, context);
  SAME_FIELD(ibv_mr, pd);
  SAME_FIELD(ibv_mr, addr);
  SAME_FIELD(ibv_mr, length);
  SAME_FIELD(ibv_mr, handle);
  SAME_FIELD(ibv_mr, lkey);
  SAME_FIELD(ibv_mr, rkey);

  std::printf("verbs_abi.h matches rdma-core's verbs.h (IBV_* and ibv_*: %d checks)\n", checked);
  return 0;
}
