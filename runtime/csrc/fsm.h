// The per-rank finite-state machine: steps a trainer through one rank's
// program. Semantics are runtime/reference.py's, which is the readable form
// (the DBO part follows the simulator's policy, steps being instruction
// indices); the differential tests hold the two to the same actions and counters.
//
// Threads: advance() and register_task() belong to the training thread;
// complete() and report_tokens() may be called from any thread (a monitor
// thread polling collectives). The hand-off is lock-free: one atomic state
// byte and one atomic timestamp per action, one atomic prediction per slot.
// The FSM never starts a thread and never calls back into its caller.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "format.h"

namespace tessera {

enum class ActionKind : uint8_t { Run = 0, Send = 1, Recv = 2, Collective = 3, Wait = 4, Done = 5 };

struct Action {
  ActionKind kind = ActionKind::Done;
  int64_t id = -1;
  int32_t stream = -1;
  int64_t task = -1;
  int64_t mb = -1;
  int32_t peer = -1;
  int64_t vstage = -1;
  int32_t payload = -1;
  int32_t collective = -1;
  int32_t group = -1;
  bool filled = false;
  bool fallback = false;
  int64_t wait_for = -1;
};

// runtime/reference.py's COUNTER_NAMES, in the same order.
struct Counters {
  uint64_t tasks_run = 0, offered = 0, deferred = 0, refused_memory = 0, refused_deadline = 0, placed = 0,
           fallbacks = 0, slots = 0, slots_filled = 0;
  double predicted_us = 0, observed_us = 0, abs_error_us = 0, placed_us = 0, recovered_us = 0, overrun_us = 0,
         fallback_us = 0;
  uint64_t peak_pool_bytes = 0;
};

// Largest per-rank token load over the mean; rank r owns experts r*E/ep .. (r+1)*E/ep - 1.
double load_imbalance(const std::vector<int64_t>& expert_tokens, uint32_t ep);

class FSM {
 public:
  // admission: the DBO's deadline-aware admission (runtime/dbo.py, "Admission"); off, the pool
  // takes whatever the memory budget allows (the policy before it, kept for comparison).
  FSM(std::shared_ptr<const Program> program, bool dbo, std::optional<uint64_t> memory_budget_bytes, double min_slot_us,
      uint32_t max_registered, bool admission = true);

  // Training thread.
  Action advance();
  int64_t register_task(uint32_t task, uint32_t mb, uint32_t deadline, std::optional<uint64_t> memory_bytes);
  const Counters& counters() const { return counters_; }
  uint32_t pc() const { return pc_; }

  // Any thread.
  void complete(int64_t action_id);
  bool report_tokens(uint32_t task, uint32_t mb, const std::vector<int64_t>& expert_tokens);

 private:
  enum : uint8_t { kNew = 0, kIssued = 1, kDone = 2, kPooled = 3 };
  struct Pooled {
    int64_t id;
    uint32_t task, mb;
    int64_t deadline_step;
    uint64_t memory_bytes;
    double duration_us;
  };
  struct Ready {
    Pooled task;
    bool filled, fallback;
  };
  struct Observation {
    uint32_t collective;
    int64_t open_ns;
    double predicted_us, placed_us;
  };

  Action issue(ActionKind kind, const Instr& ins);
  Action issue_ready();
  void offer(int64_t id, uint32_t task, uint32_t mb, uint32_t deadline, uint64_t memory_bytes);
  bool admissible(const Pooled& entry, int64_t step) const;
  size_t slots_through(int64_t step) const;
  void take(const Pooled& entry);
  void due();
  void slot(const Instr& ins);
  void observe();

  std::shared_ptr<const Program> program_;
  const std::vector<Instr>& code_;
  bool dbo_;
  bool admission_;
  uint64_t budget_;
  double min_slot_us_;
  size_t end_;
  size_t capacity_;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
  std::unique_ptr<std::atomic<int64_t>[]> done_ns_;
  std::atomic<size_t> size_;
  std::unique_ptr<std::atomic<uint64_t>[]> predicted_bits_;  // per instruction; NaN until reported
  std::vector<uint8_t> timed_;  // per instruction: an All-to-All a SLOT watches (complete() reads the clock)
  std::unordered_map<uint64_t, uint32_t> slot_of_;             // (task << 32 | mb) -> SLOT instruction
  // The admission's forecast (runtime/dbo.py, "Admission"): each SLOT's instruction index, its
  // balanced-routing size (0 below min_slot_us), prefix sums of the sizes (slot_cum_[j]: the
  // first j SLOTs) and a sparse table of maxima (slot_max_[k][j]: the largest of 2^k from j).
  std::vector<int64_t> slot_steps_;
  std::vector<double> slot_cum_;
  std::vector<std::vector<double>> slot_max_;

  uint32_t pc_ = 0;
  // The pool, indexed two ways: by (deadline step, id) for fallbacks and by
  // (-duration, deadline step, id), the best-fit order, for filling slots.
  std::unordered_map<int64_t, Pooled> pool_;
  std::set<std::pair<int64_t, int64_t>> by_deadline_;
  std::set<std::tuple<double, int64_t, int64_t>> by_fit_;
  uint64_t pool_bytes_ = 0;
  std::deque<Ready> ready_;
  std::vector<Observation> pending_;
  size_t end_scan_ = 0;
  Counters counters_;
};

// Nanoseconds per advance()+complete() pair on `program` with no work in
// between: the interpreter's own cost per action, timed inside C++. The best of
// `repeats` runs through the whole program, in wall-clock time and in the
// thread's CPU time (which a busy machine does not inflate).
struct NativeTiming {
  double wall_ns, cpu_ns;
};
NativeTiming native_ns_per_action(std::shared_ptr<const Program> program, bool dbo,
                                  std::optional<uint64_t> memory_budget_bytes, int repeats);

}  // namespace tessera
