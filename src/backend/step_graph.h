// Replayed micro-batches (run.cuda_graph): a Backend that sits between the model and the
// real backend and runs each training micro-batch's forward and backward as one recorded graph
// whenever the micro-batch makes the same op calls as one recorded before.
//
// How a micro-batch runs (run()):
//  1. check: the model's host code runs against this proxy, which only notes each op and its
//     by-value arguments (the signature) and the values a recording reads from its table instead
//     (every dropout seed, the loss scale dloss; Backend::bind_slot). Nothing runs on the backend.
//  2. a recording of the same signature exists: it is replayed with this micro-batch's values (when
//     the backend refuses, because a buffer the recording points into has been reallocated since,
//     the micro-batch runs eagerly and the recording is dropped, to be made again);
//  3. else, when this signature has run eagerly before (so that every grow-only buffer has grown):
//     it is recorded (Backend::capture_begin .. capture_end) and then replayed, or, when the
//     recording fails (an op that synchronised or grew a buffer), run eagerly and not tried again;
//  4. else it runs eagerly, its signature noted.
// A micro-batch whose ops synchronise, allocate or read back during the check runs eagerly. So a
// replay runs exactly the ops the eager path would, with the same arguments and values, and the
// results are bitwise the eager ones. Shapes that vary (trimmed lengths, example counts) each get
// their recording, up to `max_recordings` (then they run eagerly).
//
// A backend that cannot record (Backend::can_capture false: the CPU) is emulated when `emulate`
// is set: the recording keeps the calls themselves and a replay makes them again with the table's
// values. That is how the CPU tests check this bookkeeping (tests/unit/test_step_graph.cpp), and
// how NLPTRAIN_STEP_GRAPH_EMULATE=1 lets a CPU run take the trainer's graph path.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/forwarding_backend.h"

namespace nlp {

class StepGraph final : public ForwardingBackend {
 public:
  enum class How { Eager, Recorded, Replayed };
  struct Stats {
    long eager = 0, recorded = 0, replayed = 0;
    long failed = 0;         // recordings that failed (their signatures then run eagerly)
    long dropped = 0;        // recordings the backend refused to replay (recorded again later)
    std::string last_why;    // why the last micro-batch ran eagerly, or the last recording failed
    std::map<std::string, long> eager_why;  // micro-batches run eagerly, by reason
    long checks = 0;            // check passes (the host's walk of a micro-batch's calls, step 1)
    double check_seconds = 0;   // their host time, in total (the GPU waits for it before a replay)
  };

  // inner: the backend that runs the ops. emulate: record by keeping the calls when inner cannot
  // record itself (else such a StepGraph only passes every call through).
  StepGraph(Backend& inner, bool emulate, size_t max_recordings = 8);
  ~StepGraph() override;

  // Runs one micro-batch: body() makes its op calls on *this (Model::forward_into and backward).
  // body may run up to three times (check, record, eager), so it must do nothing else.
  How run(const std::function<void()>& body);
  const Stats& stats() const { return stats_; }
  bool records() const { return native_ || emulate_; }

  // ---- the ops: each as core/backend_ops.def's graph column says (RECORDED, SEED, DLOSS: noted,
  // recorded, replayed; BETWEEN: allowed only between micro-batches; QUERY: ForwardingBackend's) ----
#define NLP_OP(name, ret, params, args, impl, graph, account, cost) \
  NLP_STEP_GRAPH_DECLARE_##graph(name, ret, params)
#define NLP_STEP_GRAPH_DECLARE_RECORDED(name, ret, params) ret name params override;
#define NLP_STEP_GRAPH_DECLARE_SEED(name, ret, params) ret name params override;
#define NLP_STEP_GRAPH_DECLARE_DLOSS(name, ret, params) ret name params override;
#define NLP_STEP_GRAPH_DECLARE_BETWEEN(name, ret, params) ret name params override;
#define NLP_STEP_GRAPH_DECLARE_QUERY(name, ret, params)
#define NLP_STEP_GRAPH_DECLARE_OWN(name, ret, params)
#include "core/backend_ops.def"
#undef NLP_STEP_GRAPH_DECLARE_RECORDED
#undef NLP_STEP_GRAPH_DECLARE_SEED
#undef NLP_STEP_GRAPH_DECLARE_DLOSS
#undef NLP_STEP_GRAPH_DECLARE_BETWEEN
#undef NLP_STEP_GRAPH_DECLARE_QUERY
#undef NLP_STEP_GRAPH_DECLARE_OWN
  // the fused head: dloss from the table for the backward only (the forward has none)
  void lm_head_crossentropy(float* losses, Act dx, float* dw, CAct x, const float* w,
                            const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                            int chunk, float* scratch) override;

 private:
  enum class Mode { Pass, Check, Record };
  // One op call: f makes it on a backend, given its value (seed or slot_word(dloss); 0 for ops
  // without one).
  using Call = std::function<void(Backend&, uint64_t)>;
  // sign() appends the call's by-value arguments (pointers, sizes, flags, scalars) to the signature
  // (sign_args); op_with_value: the value comes from the recording's table at a replay.
  template <class S, class F>
  void op(const char* name, S&& sign, F&& f);
  template <class S, class F>
  void op_with_value(const char* name, uint64_t value, S&& sign, F&& f);
  template <class S>
  void note(const char* name, bool has_value, S&& sign);
  template <class... A>
  void sign_args(const A&... a);
  struct Entry;  // a recording and the signature it was made of
  void launch(const Entry& e);
  // A call that synchronises, allocates or reads back: allowed only between micro-batches.
  void unsafe(const char* name);
  How eager(const std::function<void()>& body, const std::string& why);

  const bool native_, emulate_;
  const size_t max_recordings_;
  Mode mode_ = Mode::Pass;
  std::vector<uint64_t> sig_;     // the signature of the micro-batch being checked or recorded
  std::vector<uint64_t> values_;  // its values, in call order (slot k = the k-th value)
  std::string unsafe_;            // the first unsafe call of the check, if any
  std::vector<std::pair<Call, int>> calls_;  // emulated recording: each call and its slot (-1: none)
  int slot_ = 0;                             // the next slot of the recording
  std::map<uint64_t, std::unique_ptr<Entry>> recordings_;  // by the signature's hash
  std::set<uint64_t> seen_, failed_;  // hashes of signatures run eagerly / whose recording failed
  Stats stats_;
};

}  // namespace nlp
