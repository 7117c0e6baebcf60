// The communicator end to end, with every rank a thread of this process, so
// that ThreadSanitizer sees the progress thread, the point-to-point thread, the
// callers and abort() racing each other (and AddressSanitizer sees their memory).
//
// Built and run by tests/native/test_cpp.py under ASan+UBSan and under TSan.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agreed_reduce.h"
#include "communicator.h"
#include "error.h"
#include "tcp_store.h"

using namespace rcoll;
using std::chrono::milliseconds;

namespace {

std::atomic<int> g_failures{0};

void check(bool ok, const std::string& what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "FAIL rank %d: %s\n", rank, what.c_str());
    g_failures++;
  }
}

// Runs body(rank, communicator) on `world` threads that rendezvous through one store.
void runWorld(int world, const std::string& name, int port, const std::function<void(int, Communicator&)>& body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto store = std::make_shared<TcpStoreClient>("127.0.0.1", port, milliseconds(10000));
        CommunicatorOptions options;
        options.name = name;
        options.timeout = milliseconds(20000);
        options.bind_hint = "127.0.0.1";
        // Owned by a shared_ptr, as the Python binding owns it: untimed waits
        // may then run queued ops on the waiting thread (Communicator::runInline).
        auto comm = std::make_shared<Communicator>(store, rank, world, options);
        body(rank, *comm);
      } catch (const std::exception& e) {
        check(false, std::string("unexpected exception: ") + e.what(), rank);
      }
    });
  }
  for (auto& t : threads) t.join();
}

void collectives(int rank, Communicator& comm) {
  const int P = comm.size();
  // Many async ops in flight, several kinds, checked after all are issued.
  const size_t n = 100003;  // odd, many segments at the small chunk size set in main()
  std::vector<std::vector<float>> bufs(8, std::vector<float>(n));
  std::vector<std::shared_ptr<Work>> works;
  for (size_t i = 0; i < bufs.size(); ++i) {
    for (size_t k = 0; k < n; ++k) bufs[i][k] = static_cast<float>((rank + 1) * (k % 7) + i);
    works.push_back(comm.allreduce(bufs[i].data(), bufs[i].data(), n, DataType::kFloat32, ReduceOp::kSum));
  }
  std::vector<int64_t> mine(5, rank), all(5 * P);
  works.push_back(comm.allgather(mine.data(), all.data(), 5, DataType::kInt64));
  std::vector<double> bc(33, rank == P - 1 ? 2.5 : 0.0);
  works.push_back(comm.broadcast(bc.data(), bc.data(), bc.size(), DataType::kFloat64, P - 1));
  std::vector<int32_t> rs_in(4 * P, rank + 1), rs_out(4);
  works.push_back(comm.reduceScatter(rs_in.data(), rs_out.data(), 4, DataType::kInt32, ReduceOp::kMax));
  std::vector<float> red(17, 1.0f), red_out(17, 0.0f);
  works.push_back(comm.reduce(red.data(), red_out.data(), red.size(), DataType::kFloat32, ReduceOp::kSum, 0));
  std::vector<int8_t> gat(3, static_cast<int8_t>(rank)), gat_out(3 * P, -1);
  works.push_back(comm.gather(gat.data(), gat_out.data(), 3, DataType::kInt8, P - 1));
  std::vector<uint8_t> sc_in(2 * P), sc_out(2);
  for (int r = 0; r < P; ++r) sc_in[2 * r] = sc_in[2 * r + 1] = static_cast<uint8_t>(10 + r);
  works.push_back(comm.scatter(sc_in.data(), sc_out.data(), 2, DataType::kUInt8, 0));
  std::vector<int64_t> counts(P, 2), displs(P);
  for (int r = 0; r < P; ++r) displs[r] = 2 * r;
  std::vector<int32_t> a2a_in(2 * P), a2a_out(2 * P);
  for (int r = 0; r < P; ++r) a2a_in[2 * r] = a2a_in[2 * r + 1] = rank * 100 + r;
  works.push_back(comm.allToAll(a2a_in.data(), a2a_out.data(), counts, displs, counts, displs, DataType::kInt32));
  works.push_back(comm.barrier());
  for (auto& w : works) w->wait(milliseconds(-1));

  const float sum_ranks = static_cast<float>(P * (P + 1) / 2);
  for (size_t i = 0; i < bufs.size(); ++i) {
    bool ok = true;
    for (size_t k = 0; k < n; ++k) ok &= bufs[i][k] == sum_ranks * static_cast<float>(k % 7) + P * i;
    check(ok, "allreduce " + std::to_string(i), rank);
  }
  for (int r = 0; r < P; ++r) check(all[5 * r] == r && all[5 * r + 4] == r, "allgather", rank);
  check(bc[0] == 2.5 && bc[32] == 2.5, "broadcast", rank);
  check(rs_out[0] == P && rs_out[3] == P, "reduce_scatter", rank);
  if (rank == 0) check(red_out[0] == static_cast<float>(P) && red_out[16] == static_cast<float>(P), "reduce", rank);
  if (rank == P - 1) {
    for (int r = 0; r < P; ++r) check(gat_out[3 * r] == r && gat_out[3 * r + 2] == r, "gather", rank);
  }
  check(sc_out[0] == 10 + rank && sc_out[1] == 10 + rank, "scatter", rank);
  for (int r = 0; r < P; ++r) check(a2a_out[2 * r] == r * 100 + rank, "alltoall", rank);

  if (P == 1) return;
  // Point-to-point around the ring, both directions at once, beside a collective.
  const int next = (rank + 1) % P, prev = (rank + P - 1) % P;
  std::vector<float> out(1 << 18, static_cast<float>(rank)), in(1 << 18, -1.0f);
  auto s = comm.send(out.data(), out.size(), DataType::kFloat32, next, 7);
  auto r = comm.recv(in.data(), in.size(), DataType::kFloat32, prev, 7);
  std::vector<float> x(4, 1.0f);
  auto c = comm.allreduce(x.data(), x.data(), 4, DataType::kFloat32, ReduceOp::kSum);
  s->wait(milliseconds(-1));
  r->wait(milliseconds(-1));
  c->wait(milliseconds(-1));
  check(in[0] == static_cast<float>(prev) && in.back() == static_cast<float>(prev), "send/recv", rank);
  check(x[0] == static_cast<float>(P), "allreduce beside send/recv", rank);
}

// Ops run by the caller (Launch::kCallerWaits), by an untimed waiter and by the
// progress thread, interleaved: issue order must hold and every result be right.
// A second thread waits on the same queued works meanwhile, so two waiters and
// the progress thread race for each op.
void inlineMix(int rank, Communicator& comm) {
  const int P = comm.size();
  const size_t sizes[] = {1, 7, 1000, 20000};  // recursive doubling and the ring
  for (int round = 0; round < 20; ++round) {
    std::vector<std::vector<float>> bufs;
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < 6; ++i) {
      const size_t n = sizes[(round + i) % 4];
      bufs.emplace_back(n, static_cast<float>(rank + i));
      const Launch launch = i % 3 == 2 ? Launch::kCallerWaits : Launch::kQueued;
      works.push_back(comm.allreduce(bufs.back().data(), bufs.back().data(), n, DataType::kFloat32, ReduceOp::kSum,
                                     milliseconds(0), launch));
    }
    std::thread second_waiter([&] {
      for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait(milliseconds(-1));
    });
    for (auto& w : works) w->wait(milliseconds(-1));
    second_waiter.join();
    for (int i = 0; i < 6; ++i) {
      const float expected = static_cast<float>(P * (P - 1) / 2 + P * i);
      bool ok = true;
      for (float v : bufs[static_cast<size_t>(i)]) ok &= v == expected;
      check(ok, "inline mix round " + std::to_string(round) + " op " + std::to_string(i), rank);
    }
  }
}

// Rank 0 aborts from another thread while its op waits for a rank that never
// joins; every rank's pending work must fail promptly, nothing may hang.
void abortRace(int rank, Communicator& comm) {
  std::vector<float> x(1024, 1.0f);
  if (rank == comm.size() - 1) {
    // Never joins the allreduce: waits until the others have failed and told it.
    std::this_thread::sleep_for(milliseconds(300));
    auto w = comm.barrier();
    bool failed = false;
    try {
      w->wait(milliseconds(15000));
    } catch (const RcollError& e) {
      failed = true;
    }
    check(failed, "the silent rank's next op fails with the abort", rank);
    return;
  }
  auto work = comm.allreduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
  auto p2p = comm.recv(x.data(), 4, DataType::kFloat32, (rank + 1) % comm.size(), 0);
  std::thread aborter;
  if (rank == 0)
    aborter = std::thread([&] {
      std::this_thread::sleep_for(milliseconds(100));
      comm.abort("test abort");
    });
  auto t0 = std::chrono::steady_clock::now();
  bool failed = false;
  try {
    work->wait(milliseconds(15000));
  } catch (const RcollError& e) {
    failed = true;
  }
  try {
    p2p->wait(milliseconds(15000));
  } catch (const RcollError&) {
  }
  auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  check(failed && seconds < 10, "abort fails the pending op promptly", rank);
  check(p2p->isCompleted() && p2p->failed(), "abort fails the pending recv", rank);
  if (aborter.joinable()) aborter.join();
}

// agreeAndReduce (agreed_reduce.h): the AND of the offers, and a reduction
// only when every rank handed in the same agreed candidate.
void agreedReduce(int rank, Communicator& comm) {
  const int P = comm.size();
  uint8_t offer[3], agreed[3];
  AgreedReduceArgs a;
  a.offer = offer;
  a.agreed = agreed;
  a.offer_bytes = sizeof offer;
  a.candidates_at = 1;
  a.payload_capacity = 64;
  a.dtype = DataType::kInt32;
  a.op = ReduceOp::kSum;
  // Every rank offers candidates 3 and 9 (and one of its own): both are
  // agreed, and the inputs tagged 9 are summed in rank order.
  offer[0] = 0xF0 | static_cast<uint8_t>(rank);
  offer[1] = static_cast<uint8_t>(1u << 3 | 1u << (4 + rank % 4));
  offer[2] = 1u << 1;  // candidate 9
  std::vector<int32_t> input = {rank + 1, -rank, 7};
  std::vector<int32_t> out(3, -99);
  a.tag = 9;
  a.input = input.data();
  a.out = out.data();
  a.count = 3;
  const bool folded = agreeAndReduce(comm, a);
  check(folded, "every rank tagged agreed candidate 9: folded", rank);
  uint8_t header = 0xFF, bits = 0xFF;
  for (int r = 0; r < P; ++r) {
    header &= static_cast<uint8_t>(0xF0 | r);
    bits &= static_cast<uint8_t>(1u << 3 | 1u << (4 + r % 4));
  }
  check(agreed[0] == header && agreed[1] == bits && agreed[2] == (1u << 1), "agreed is the AND of the offers", rank);
  check(out[0] == P * (P + 1) / 2 && out[1] == -P * (P - 1) / 2 && out[2] == 7 * P, "the inputs summed", rank);

  // In place, float avg: divided once by the world size.
  std::vector<float> values = {1.0f + static_cast<float>(rank), 2.0f};
  a.dtype = DataType::kFloat32;
  a.op = ReduceOp::kAvg;
  a.input = a.out = values.data();
  a.count = 2;
  check(agreeAndReduce(comm, a), "in place avg folded", rank);
  check(values[0] == (1.0f + static_cast<float>(P + 1) / 2.0f - 1.0f) && values[1] == 2.0f, "avg in place", rank);

  // One rank hands in nothing: no rank folds, nobody's output changes.
  std::vector<int32_t> untouched(3, -5);
  a.dtype = DataType::kInt32;
  a.op = ReduceOp::kMax;
  a.input = input.data();
  a.out = untouched.data();
  a.count = 3;
  a.tag = rank == P - 1 ? -1 : 9;
  check(!agreeAndReduce(comm, a) && untouched[0] == -5, "a rank without a tag: not folded", rank);
  // Every rank tags candidate 3, which one rank did not offer: not folded.
  a.tag = 3;
  if (rank == 0) offer[1] = 0;
  check(!agreeAndReduce(comm, a) && untouched[0] == -5 && (P == 1 || agreed[1] == 0),
        "a candidate not everyone offered: not folded", rank);
  offer[1] = 1u << 3;
  // The same tag with another count on one rank: every rank is told which.
  a.count = rank == P - 1 && P > 1 ? 2 : 3;
  bool named = false;
  try {
    agreeAndReduce(comm, a);
  } catch (const RcollError& e) {
    named = e.kind() == ErrorKind::kInvalidArgument &&
            std::string(e.what()).find("rank " + std::to_string(P - 1) + " 2 elements") != std::string::npos;
  }
  check(named || P == 1, "inputs that differ under one tag: an InvalidArgument naming the rank", rank);
  // An input over the capacity on one rank: every rank raises (none waits
  // for that rank), the rank itself saying why, the others naming it.
  a.count = rank == 0 ? 17 : 3;
  std::string refusal;
  try {
    agreeAndReduce(comm, a);
  } catch (const RcollError& e) {
    if (e.kind() == ErrorKind::kInvalidArgument) refusal = e.what();
  }
  check(refusal.find(rank == 0 ? "68 bytes of input do not fit the 64" : "rank 0 could not hand in its input") !=
            std::string::npos,
        "an input over the capacity on rank 0: every rank raises (" + refusal + ")", rank);
  // The communicator goes on.
  a.count = 1;
  a.tag = 3;
  a.out = untouched.data();
  check(agreeAndReduce(comm, a) && untouched[0] == P, "after the errors: folded again", rank);
  // The agreement alone (a large communicator across hosts): the AND, nothing folded.
  a.agreement_only = true;
  offer[0] = static_cast<uint8_t>(0xF0 | rank);
  untouched[0] = -5;
  check(!agreeAndReduce(comm, a) && untouched[0] == -5 && agreed[0] == header && agreed[1] == (1u << 3),
        "agreement only: the AND, nothing folded", rank);
}

}  // namespace

int main() {
  // Small segments: many pipeline steps per op, so the threads interleave a lot.
  setenv("RCOLL_CHUNK_BYTES", "4096", 1);
  setenv("RCOLL_MIN_CHUNK_BYTES", "1024", 1);
  setenv("RCOLL_DEBUG", "NONE", 1);
  TcpStoreServer server("127.0.0.1", 0);
  runWorld(3, "collectives", server.port(), collectives);
  runWorld(1, "single", server.port(), collectives);
  runWorld(3, "inline", server.port(), inlineMix);
  runWorld(3, "agreed", server.port(), agreedReduce);
  runWorld(1, "agreed-single", server.port(), agreedReduce);
  runWorld(3, "abort", server.port(), abortRace);
  // The TCP transport with three sockets per pair: segments striped over them,
  // a failure or an abort reaching every one.
  setenv("RCOLL_TRANSPORT", "tcp", 1);
  setenv("RCOLL_SOCKETS_PER_PEER", "3", 1);
  runWorld(3, "tcp3-collectives", server.port(), collectives);
  runWorld(3, "tcp3-abort", server.port(), abortRace);
  unsetenv("RCOLL_TRANSPORT");
  unsetenv("RCOLL_SOCKETS_PER_PEER");
  if (g_failures.load() != 0) {
    std::fprintf(stderr, "test_communicator: %d failures\n", g_failures.load());
    return 1;
  }
  std::printf("test_communicator: all passed\n");
  return 0;
}
