#include "fsm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <time.h>

namespace tessera {
namespace {

constexpr double kFitEpsUs = 1e-9;  // the fit test's tolerance, as the policy's

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of the calling thread: on a shared machine, what the work itself cost, without the
// time the thread spent descheduled.
int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

uint64_t bits_of(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

double double_of(uint64_t b) {
  double d;
  std::memcpy(&d, &b, sizeof d);
  return d;
}

const uint64_t kUnreported = bits_of(std::numeric_limits<double>::quiet_NaN());

}  // namespace

double load_imbalance(const std::vector<int64_t>& expert_tokens, uint32_t ep) {
  size_t n = expert_tokens.size();
  if (n == 0 || n % ep)
    throw std::invalid_argument(std::to_string(n) + " per-expert token counts cannot be split evenly over " +
                                std::to_string(ep) + " expert-parallel ranks");
  size_t per_rank = n / ep;
  int64_t total = 0, most = std::numeric_limits<int64_t>::min();
  for (uint32_t r = 0; r < ep; ++r) {
    int64_t load = 0;
    for (size_t k = r * per_rank; k < (r + 1) * per_rank; ++k) load += expert_tokens[k];
    total += load;
    most = std::max(most, load);
  }
  return total <= 0 ? 1.0 : double(most * int64_t(ep)) / double(total);
}

FSM::FSM(std::shared_ptr<const Program> program, bool dbo, std::optional<uint64_t> memory_budget_bytes,
         double min_slot_us, uint32_t max_registered, bool admission)
    : program_(std::move(program)),
      code_(program_->code),
      dbo_(dbo),
      admission_(admission),
      budget_(memory_budget_bytes.value_or(program_->plan.memory_budget_bytes)),
      min_slot_us_(min_slot_us),
      end_(code_.size() - 1),
      capacity_(code_.size() + max_registered),
      state_(new std::atomic<uint8_t>[capacity_]),
      done_ns_(new std::atomic<int64_t>[capacity_]),
      size_(code_.size()),
      predicted_bits_(new std::atomic<uint64_t>[code_.size()]),
      timed_(code_.size(), 0) {
  for (size_t i = 0; i < capacity_; ++i) {
    state_[i].store(kNew, std::memory_order_relaxed);
    done_ns_[i].store(0, std::memory_order_relaxed);
  }
  std::vector<double> sizes;
  slot_cum_.push_back(0.0);
  for (size_t i = 0; i < code_.size(); ++i) {
    predicted_bits_[i].store(kUnreported, std::memory_order_relaxed);
    if (code_[i].op == Op::Slot) {
      slot_of_[(uint64_t(code_[code_[i].b].a) << 32) | code_[i].mb] = uint32_t(i);
      timed_[code_[i].b] = 1;
      double base = program_->slots[code_[i].a].base_us;
      slot_steps_.push_back(int64_t(i));
      sizes.push_back(base >= min_slot_us_ && base > 0 ? base : 0.0);
      slot_cum_.push_back(slot_cum_.back() + sizes.back());
    }
  }
  slot_max_.push_back(std::move(sizes));
  for (size_t width = 1; 2 * width <= slot_max_[0].size(); width *= 2) {
    const std::vector<double>& previous = slot_max_.back();
    std::vector<double> next(previous.size() - width);
    for (size_t j = 0; j < next.size(); ++j) next[j] = std::max(previous[j], previous[j + width]);
    slot_max_.push_back(std::move(next));
  }
}

size_t FSM::slots_through(int64_t step) const {
  return size_t(std::upper_bound(slot_steps_.begin(), slot_steps_.end(), step) - slot_steps_.begin());
}

bool FSM::admissible(const Pooled& entry, int64_t step) const {
  if (entry.deadline_step == step) return true;  // due at its own step: it moves past nothing
  const size_t lo = slots_through(step), hi = slots_through(entry.deadline_step);
  double largest = 0.0;
  if (hi > lo) {
    size_t level = 0;
    while ((size_t(2) << level) <= hi - lo) ++level;
    largest = std::max(slot_max_[level][lo], slot_max_[level][hi - (size_t(1) << level)]);
  }
  if (largest + kFitEpsUs < entry.duration_us) return false;
  // Earliest deadline first over the pooled tasks still waiting after this step, the offered one
  // in its (deadline step, id) place: each partial sum must fit the SLOTs up to its deadline.
  const double base = slot_cum_[lo];
  double demand = 0.0;
  bool counted = false;
  auto fits = [&](const Pooled& e) {
    demand += e.duration_us;
    return e.deadline_step < entry.deadline_step ||
           demand <= slot_cum_[slots_through(e.deadline_step)] - base + kFitEpsUs;
  };
  for (auto it = by_deadline_.upper_bound({step, std::numeric_limits<int64_t>::max()}); it != by_deadline_.end(); ++it) {
    if (!counted && std::make_pair(entry.deadline_step, entry.id) < *it) {
      counted = true;
      if (!fits(entry)) return false;
    }
    if (!fits(pool_.at(it->second))) return false;
  }
  return counted || fits(entry);
}

void FSM::complete(int64_t id) {
  if (id < 0 || size_t(id) >= size_.load(std::memory_order_acquire) ||
      state_[id].load(std::memory_order_acquire) != kIssued)
    throw std::invalid_argument("action " + std::to_string(id) + " is not in flight (never issued, or already completed)");
  // Only an All-to-All a SLOT watches needs its finishing time (the observed idle).
  if (size_t(id) < timed_.size() && timed_[id]) done_ns_[id].store(now_ns(), std::memory_order_relaxed);
  uint8_t expected = kIssued;
  if (!state_[id].compare_exchange_strong(expected, kDone, std::memory_order_acq_rel))
    throw std::invalid_argument("action " + std::to_string(id) + " was completed twice");
}

bool FSM::report_tokens(uint32_t task, uint32_t mb, const std::vector<int64_t>& expert_tokens) {
  double imbalance = load_imbalance(expert_tokens, program_->plan.ep);
  auto it = slot_of_.find((uint64_t(task) << 32) | mb);
  if (it == slot_of_.end()) return false;
  const SlotInfo& s = program_->slots[code_[it->second].a];
  double predicted = std::max(0.0, s.base_us + (s.a2a_us + s.gemm_us) * (imbalance - 1.0));
  predicted_bits_[it->second].store(bits_of(predicted), std::memory_order_release);
  return true;
}

int64_t FSM::register_task(uint32_t task, uint32_t mb, uint32_t deadline, std::optional<uint64_t> memory_bytes) {
  const auto& tasks = program_->tasks;
  if (task >= tasks.size() || !tasks[task].movable)
    throw std::invalid_argument("task " + std::to_string(task) + " is not a movable task of the plan");
  if (mb >= program_->plan.microbatches)
    throw std::invalid_argument("micro-batch " + std::to_string(mb) + " is not in the plan");
  if (!(pc_ < deadline && deadline <= end_))
    throw std::invalid_argument("deadline " + std::to_string(deadline) + " is not after the current instruction " +
                                std::to_string(pc_) + " and at or before END");
  size_t id = size_.load(std::memory_order_relaxed);
  if (id >= capacity_)
    throw std::invalid_argument("more than " + std::to_string(capacity_ - code_.size()) +
                                " tasks registered in one iteration");
  size_.store(id + 1, std::memory_order_release);
  offer(int64_t(id), task, mb, deadline, memory_bytes.value_or(tasks[task].memory_bytes));
  return int64_t(id);
}

void FSM::offer(int64_t id, uint32_t task, uint32_t mb, uint32_t deadline, uint64_t memory_bytes) {
  Pooled entry{id, task, mb, int64_t(deadline) - 1, memory_bytes, program_->tasks[task].duration_us};
  if (!dbo_) {
    ready_.push_back({entry, false, false});
    return;
  }
  ++counters_.offered;
  // Compared without overflow: pool_bytes_ never exceeds budget_.
  if (memory_bytes > budget_ - pool_bytes_) {
    ++counters_.refused_memory;
    ready_.push_back({entry, false, false});
    return;
  }
  // A DEFER offers at its own instruction, a registered task at the current one.
  if (admission_ && !admissible(entry, id < int64_t(code_.size()) ? id : int64_t(pc_))) {
    ++counters_.refused_deadline;
    ready_.push_back({entry, false, false});
    return;
  }
  state_[id].store(kPooled, std::memory_order_relaxed);
  pool_.emplace(id, entry);
  by_deadline_.emplace(entry.deadline_step, id);
  by_fit_.emplace(-entry.duration_us, entry.deadline_step, id);
  pool_bytes_ += memory_bytes;
  ++counters_.deferred;
  counters_.peak_pool_bytes = std::max(counters_.peak_pool_bytes, pool_bytes_);
}

void FSM::take(const Pooled& e) {
  pool_bytes_ -= e.memory_bytes;
  by_deadline_.erase({e.deadline_step, e.id});
  by_fit_.erase({-e.duration_us, e.deadline_step, e.id});
  pool_.erase(e.id);
}

void FSM::due() {
  const int64_t step = int64_t(pc_) - 1;  // the end of the step before this instruction
  if (by_deadline_.empty() || by_deadline_.begin()->first > step) return;
  std::vector<Pooled> out;
  while (!by_deadline_.empty() && by_deadline_.begin()->first <= step) {
    Pooled e = pool_.at(by_deadline_.begin()->second);
    out.push_back(e);
    take(e);
  }
  std::sort(out.begin(), out.end(), [](const Pooled& x, const Pooled& y) { return x.id < y.id; });
  double total = 0;  // summed first, then added, as the policy does
  for (const Pooled& p : out) {
    total += p.duration_us;
    ready_.push_back({p, false, true});
  }
  counters_.fallbacks += out.size();
  counters_.fallback_us += total;
}

void FSM::slot(const Instr& ins) {
  const int64_t step = pc_++;
  if (!dbo_ || state_[ins.b].load(std::memory_order_acquire) == kDone) return;
  double predicted = double_of(predicted_bits_[step].load(std::memory_order_acquire));
  if (std::isnan(predicted)) predicted = program_->slots[ins.a].base_us;
  ++counters_.slots;
  counters_.predicted_us += predicted;
  double placed = 0, remaining = predicted;
  uint64_t count = 0;
  if (predicted >= min_slot_us_ && predicted > 0) {
    for (;;) {
      // The first entry in best-fit order whose duration fits; due() already removed every task
      // whose deadline step is before this one, but the policy's rule is kept explicit.
      auto it = by_fit_.lower_bound({-(remaining + kFitEpsUs), std::numeric_limits<int64_t>::min(),
                                     std::numeric_limits<int64_t>::min()});
      while (it != by_fit_.end() && std::get<1>(*it) < step) ++it;
      if (it == by_fit_.end()) break;
      Pooled chosen = pool_.at(std::get<2>(*it));
      remaining -= chosen.duration_us;
      placed += chosen.duration_us;
      ++count;
      take(chosen);
      ++counters_.placed;
      ready_.push_back({chosen, true, false});
    }
  }
  if (count) {
    ++counters_.slots_filled;
    counters_.placed_us += placed;
  }
  pending_.push_back({ins.b, now_ns(), predicted, placed});
}

void FSM::observe() {
  if (pending_.empty()) return;
  size_t keep = 0;
  for (const Observation& o : pending_) {
    if (state_[o.collective].load(std::memory_order_acquire) != kDone) {
      pending_[keep++] = o;
      continue;
    }
    double observed = std::max(0.0, double(done_ns_[o.collective].load(std::memory_order_relaxed) - o.open_ns) / 1000.0);
    counters_.observed_us += observed;
    counters_.abs_error_us += std::abs(o.predicted_us - observed);
    counters_.recovered_us += std::min(o.placed_us, observed);
    counters_.overrun_us += std::max(0.0, o.placed_us - observed);
  }
  pending_.resize(keep);
}

Action FSM::issue(ActionKind kind, const Instr& ins) {
  Action a;
  a.kind = kind;
  a.id = pc_;
  a.stream = int32_t(ins.stream);
  a.mb = ins.mb;
  state_[pc_].store(kIssued, std::memory_order_release);
  ++pc_;
  return a;
}

Action FSM::issue_ready() {
  Ready r = ready_.front();
  ready_.pop_front();
  state_[r.task.id].store(kIssued, std::memory_order_release);
  ++counters_.tasks_run;
  Action a;
  a.kind = ActionKind::Run;
  a.id = r.task.id;
  a.stream = int32_t(Stream::Compute);
  a.task = r.task.task;
  a.mb = r.task.mb;
  a.filled = r.filled;
  a.fallback = r.fallback;
  return a;
}

Action FSM::advance() {
  observe();
  for (;;) {
    if (!ready_.empty()) return issue_ready();
    if (!pool_.empty()) {
      due();
      if (!ready_.empty()) continue;
    }
    const Instr& ins = code_[pc_];
    switch (ins.op) {
      case Op::Run: {
        ++counters_.tasks_run;
        Action a = issue(ActionKind::Run, ins);
        a.task = ins.a;
        return a;
      }
      case Op::Send:
      case Op::Recv: {
        Action a = issue(ins.op == Op::Send ? ActionKind::Send : ActionKind::Recv, ins);
        a.peer = int32_t(ins.a);
        a.vstage = ins.b;
        a.payload = ins.aux;
        return a;
      }
      case Op::Collective: {
        Action a = issue(ActionKind::Collective, ins);
        if (ins.aux == uint16_t(Collective::AllToAll)) a.task = ins.a;
        else a.vstage = ins.a;
        a.collective = ins.aux;
        a.group = int32_t(ins.b);
        return a;
      }
      case Op::Defer: {
        uint32_t i = pc_++;
        offer(i, ins.a, ins.mb, ins.b, program_->tasks[ins.a].memory_bytes);
        continue;
      }
      case Op::Wait: {
        // The loader guarantees a waited-on DEFER's deadline is at or before the wait, so it has run.
        if (state_[ins.a].load(std::memory_order_acquire) == kDone) {
          ++pc_;
          continue;
        }
        Action a;
        a.kind = ActionKind::Wait;
        a.wait_for = ins.a;
        return a;
      }
      case Op::Slot:
        slot(ins);
        continue;
      case Op::End: {
        size_t n = size_.load(std::memory_order_relaxed);
        // Nothing is issued once END is reached, so entries below end_scan_ stay finished (or never were work).
        while (end_scan_ < n && state_[end_scan_].load(std::memory_order_acquire) != kIssued) ++end_scan_;
        if (end_scan_ < n) {
          Action a;
          a.kind = ActionKind::Wait;
          a.wait_for = int64_t(end_scan_);
          return a;
        }
        observe();
        return Action{};
      }
    }
  }
}

NativeTiming native_ns_per_action(std::shared_ptr<const Program> program, bool dbo,
                                  std::optional<uint64_t> memory_budget_bytes, int repeats) {
  NativeTiming best{std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  for (int r = 0; r < repeats; ++r) {
    FSM fsm(program, dbo, memory_budget_bytes, 0.0, 0);
    uint64_t actions = 0;
    int64_t wall = now_ns(), cpu = thread_cpu_ns();
    for (;;) {
      Action a = fsm.advance();
      if (a.kind == ActionKind::Done) break;
      // Every action completes at once below, so nothing is ever waited for.
      if (a.kind == ActionKind::Wait) throw std::logic_error("benchmark program waits on unfinished work");
      fsm.complete(a.id);
      ++actions;
    }
    cpu = thread_cpu_ns() - cpu;
    wall = now_ns() - wall;
    if (actions) {
      best.wall_ns = std::min(best.wall_ns, double(wall) / double(actions));
      best.cpu_ns = std::min(best.cpu_ns, double(cpu) / double(actions));
    }
  }
  return best;
}

}  // namespace tessera
