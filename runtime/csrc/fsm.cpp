#include "fsm.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace tessera {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
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

FSM::FSM(std::shared_ptr<const Program> program, bool dbo, uint32_t ep_rank, std::optional<uint64_t> memory_budget_bytes,
         uint32_t max_registered)
    : program_(std::move(program)),
      code_(program_->code),
      dbo_(dbo),
      ep_rank_(ep_rank),
      budget_(memory_budget_bytes.value_or(program_->plan.memory_budget_bytes)),
      end_(code_.size() - 1),
      capacity_(code_.size() + max_registered),
      state_(new std::atomic<uint8_t>[capacity_]),
      done_ns_(new std::atomic<int64_t>[capacity_]),
      size_(code_.size()),
      predicted_bits_(new std::atomic<uint64_t>[code_.size()]) {
  if (ep_rank >= program_->plan.ep)
    throw std::invalid_argument("ep_rank " + std::to_string(ep_rank) + " is not in the plan's EP group of " +
                                std::to_string(program_->plan.ep));
  for (size_t i = 0; i < capacity_; ++i) {
    state_[i].store(kNew, std::memory_order_relaxed);
    done_ns_[i].store(0, std::memory_order_relaxed);
  }
  for (size_t i = 0; i < code_.size(); ++i) {
    predicted_bits_[i].store(kUnreported, std::memory_order_relaxed);
    if (code_[i].op == Op::Slot) slot_of_[(uint64_t(code_[code_[i].b].a) << 32) | code_[i].mb] = uint32_t(i);
  }
}

void FSM::complete(int64_t id) {
  if (id < 0 || size_t(id) >= size_.load(std::memory_order_acquire) ||
      state_[id].load(std::memory_order_acquire) != kIssued)
    throw std::invalid_argument("action " + std::to_string(id) + " is not in flight (never issued, or already completed)");
  done_ns_[id].store(now_ns(), std::memory_order_relaxed);
  uint8_t expected = kIssued;
  if (!state_[id].compare_exchange_strong(expected, kDone, std::memory_order_acq_rel))
    throw std::invalid_argument("action " + std::to_string(id) + " was completed twice");
}

bool FSM::report_tokens(uint32_t task, uint32_t mb, const std::vector<int64_t>& tokens) {
  if (tokens.size() != program_->plan.ep)
    throw std::invalid_argument("expected " + std::to_string(program_->plan.ep) +
                                " token counts (one per EP rank), got " + std::to_string(tokens.size()));
  auto it = slot_of_.find((uint64_t(task) << 32) | mb);
  if (it == slot_of_.end()) return false;
  const SlotInfo& slot = program_->slots[code_[it->second].a];
  int64_t most = tokens[0];
  for (int64_t t : tokens) most = t > most ? t : most;
  double excess = double(most - tokens[ep_rank_]);
  predicted_bits_[it->second].store(bits_of(slot.static_idle_us + slot.us_per_token * excess), std::memory_order_release);
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
  defer(int64_t(id), task, mb, deadline, memory_bytes.value_or(tasks[task].memory_bytes));
  return int64_t(id);
}

void FSM::defer(int64_t id, uint32_t task, uint32_t mb, uint32_t deadline, uint64_t memory_bytes) {
  Pooled entry{id, task, mb, deadline, memory_bytes, program_->tasks[task].duration_us, seq_++};
  if (!dbo_ || pool_bytes_ + memory_bytes > budget_ || pool_bytes_ + memory_bytes < pool_bytes_) {
    ++counters_.inline_;
    inline_.push_back(entry);
    return;
  }
  state_[id].store(kPooled, std::memory_order_relaxed);
  pool_.push_back(entry);
  pool_bytes_ += memory_bytes;
  ++counters_.deferred;
  if (pool_bytes_ > counters_.peak_pool_bytes) counters_.peak_pool_bytes = pool_bytes_;
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

Action FSM::issue_deferred(const Pooled& e, bool filled, bool fallback) {
  state_[e.id].store(kIssued, std::memory_order_release);
  ++counters_.tasks_run;
  Action a;
  a.kind = ActionKind::Run;
  a.id = e.id;
  a.stream = int32_t(Stream::Compute);
  a.task = e.task;
  a.mb = e.mb;
  a.filled = filled;
  a.fallback = fallback;
  return a;
}

Action FSM::issue_pooled(size_t index, bool filled, bool fallback) {
  Pooled e = pool_[index];
  pool_.erase(pool_.begin() + std::ptrdiff_t(index));
  pool_bytes_ -= e.memory_bytes;
  return issue_deferred(e, filled, fallback);
}

Action FSM::issue_inline() {
  Pooled e = inline_.front();
  inline_.pop_front();
  return issue_deferred(e, false, false);
}

void FSM::open_slot(const Instr& ins) {
  size_t i = pc_++;
  if (!dbo_ || state_[ins.b].load(std::memory_order_acquire) == kDone) return;
  double predicted = double_of(predicted_bits_[i].load(std::memory_order_acquire));
  if (std::isnan(predicted)) predicted = program_->slots[ins.a].static_idle_us;
  ++counters_.slots;
  counters_.idle_predicted_us += predicted;
  slot_ = OpenSlot{ins.b, predicted};
  pending_observations_.emplace_back(ins.b, now_ns());
}

std::optional<Action> FSM::fill() {
  OpenSlot& slot = *slot_;
  if (state_[slot.collective].load(std::memory_order_acquire) != kDone) {
    size_t best = pool_.size();
    for (size_t k = 0; k < pool_.size(); ++k) {
      const Pooled& p = pool_[k];
      if (p.duration_us > slot.budget_us) continue;
      if (best == pool_.size()) { best = k; continue; }
      const Pooled& b = pool_[best];
      if (p.duration_us > b.duration_us ||
          (p.duration_us == b.duration_us && (p.deadline < b.deadline || (p.deadline == b.deadline && p.seq < b.seq))))
        best = k;
    }
    if (best != pool_.size()) {
      slot.budget_us -= pool_[best].duration_us;
      ++counters_.filled;
      return issue_pooled(best, true, false);
    }
  }
  slot_.reset();
  return std::nullopt;
}

void FSM::observe() {
  if (pending_observations_.empty()) return;
  size_t keep = 0;
  for (auto& [collective, open] : pending_observations_) {
    if (state_[collective].load(std::memory_order_acquire) == kDone) {
      int64_t waited = done_ns_[collective].load(std::memory_order_relaxed) - open;
      counters_.idle_observed_us += waited > 0 ? double(waited) / 1000.0 : 0.0;
    } else {
      pending_observations_[keep++] = {collective, open};
    }
  }
  pending_observations_.resize(keep);
}

Action FSM::advance() {
  observe();
  if (!inline_.empty()) return issue_inline();
  for (;;) {
    if (slot_) {
      if (auto a = fill()) return *a;
      continue;
    }
    size_t due = pool_.size();
    for (size_t k = 0; k < pool_.size(); ++k) {
      const Pooled& p = pool_[k];
      if (p.deadline > pc_) continue;
      if (due == pool_.size() || p.deadline < pool_[due].deadline ||
          (p.deadline == pool_[due].deadline && p.seq < pool_[due].seq))
        due = k;
    }
    if (due != pool_.size()) {
      ++counters_.fallen_back;
      return issue_pooled(due, false, true);
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
        defer(i, ins.a, ins.mb, ins.b, program_->tasks[ins.a].memory_bytes);
        if (!inline_.empty()) return issue_inline();
        continue;
      }
      case Op::Wait: {
        uint8_t s = state_[ins.a].load(std::memory_order_acquire);
        if (s == kDone) {
          ++pc_;
          continue;
        }
        if (s == kPooled) {  // waited on before its deadline: run it now
          for (size_t k = 0; k < pool_.size(); ++k)
            if (pool_[k].id == int64_t(ins.a)) {
              ++counters_.fallen_back;
              return issue_pooled(k, false, true);
            }
        }
        Action a;
        a.kind = ActionKind::Wait;
        a.wait_for = ins.a;
        return a;
      }
      case Op::Slot:
        open_slot(ins);
        continue;
      case Op::End: {
        size_t n = size_.load(std::memory_order_relaxed);
        while (end_scan_ < n && state_[end_scan_].load(std::memory_order_acquire) != kIssued) ++end_scan_;
        if (end_scan_ < n) {
          // Everything below end_scan_ is finished or never was work; recheck from here next time.
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

double native_ns_per_action(std::shared_ptr<const Program> program, bool dbo, int repeats) {
  uint64_t actions = 0;
  int64_t total = 0;
  for (int r = 0; r < repeats; ++r) {
    FSM fsm(program, dbo, 0, std::nullopt, 0);
    int64_t start = now_ns();
    for (;;) {
      Action a = fsm.advance();
      if (a.kind == ActionKind::Done) break;
      // Every action completes at once below, so nothing is ever waited for.
      if (a.kind == ActionKind::Wait) throw std::logic_error("benchmark program waits on unfinished work");
      fsm.complete(a.id);
      ++actions;
    }
    total += now_ns() - start;
  }
  return actions ? double(total) / double(actions) : 0.0;
}

}  // namespace tessera
