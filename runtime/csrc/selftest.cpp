// Native self-test of the loader and the FSM, run by `make test` in the
// sanitizer build (-fsanitize=address,undefined). For every plan file given:
//   1. every rank's program runs to DONE single-threaded, each action exactly once;
//   2. a training thread and a monitor thread share each FSM: the training thread
//      runs compute actions, the monitor completes communication after a short
//      random delay and reports token counts. Every action must run exactly
//      once, after everything its WAITs name, and deferred tasks between their
//      DEFER and their deadline. An exception in the monitor is caught there
//      and rethrown on the main thread;
//   3. mutated copies (bit flips, truncation, resealed checksum) are either
//      refused with PlanError or run to DONE within a bounded number of steps.
#include <atomic>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fsm.h"

using namespace tessera;

namespace {

std::vector<uint8_t> read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string("cannot read ") + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

bool completes(Op op) { return op == Op::Run || op == Op::Send || op == Op::Recv || op == Op::Collective || op == Op::Defer; }

// Single producer, single consumer ring of action ids (training -> monitor).
class Ring {
 public:
  explicit Ring(size_t capacity) : slots_(capacity) {}
  bool push(int64_t v) {
    size_t h = head_.load(std::memory_order_relaxed);
    if (h - tail_.load(std::memory_order_acquire) == slots_.size()) return false;
    slots_[h % slots_.size()] = v;
    head_.store(h + 1, std::memory_order_release);
    return true;
  }
  bool pop(int64_t& v) {
    size_t t = tail_.load(std::memory_order_relaxed);
    if (t == head_.load(std::memory_order_acquire)) return false;
    v = slots_[t % slots_.size()];
    tail_.store(t + 1, std::memory_order_release);
    return true;
  }

 private:
  std::vector<int64_t> slots_;
  std::atomic<size_t> head_{0}, tail_{0};
};

struct Run {
  std::vector<int64_t> issued_at;     // action id -> issue sequence number
  std::vector<int64_t> completed_at;  // action id -> completion sequence number
};

// Runs one rank; `threaded` hands communication to a monitor thread.
Run run_rank(const std::shared_ptr<const Program>& prog, bool threaded, uint64_t seed) {
  FSM fsm(prog, true, std::nullopt, 0.0, 0);
  const size_t n = prog->code.size();
  Run run{std::vector<int64_t>(n, -1), std::vector<int64_t>(n, -1)};
  std::vector<std::atomic<int64_t>> completed(n);
  for (auto& c : completed) c.store(-1);
  std::atomic<int64_t> clock{0};
  Ring ring(n + 1);
  std::atomic<bool> stop{false};
  std::exception_ptr monitor_error;

  auto finish = [&](int64_t id) {
    completed[id].store(clock.fetch_add(1), std::memory_order_release);
    fsm.complete(id);
  };
  std::thread monitor;
  if (threaded) {
    monitor = std::thread([&] {
      try {
        std::mt19937_64 rng(seed);
        int64_t id;
        while (!stop.load(std::memory_order_acquire)) {
          if (!ring.pop(id)) { std::this_thread::yield(); continue; }
          const Instr& ins = prog->code[id];
          if (ins.op == Op::Collective && ins.aux == 0) {
            std::vector<int64_t> tokens(size_t(prog->plan.ep) * (1 + rng() % 3));
            for (auto& t : tokens) t = int64_t(rng() % 512);
            fsm.report_tokens(ins.a, ins.mb, tokens);
          }
          for (uint64_t spin = rng() % 2000; spin > 0; --spin) std::atomic_signal_fence(std::memory_order_seq_cst);
          finish(id);
        }
      } catch (...) {
        monitor_error = std::current_exception();
        stop.store(true);
      }
    });
  }
  uint64_t steps = 0;
  for (;;) {
    expect(++steps < 100 * (n + 16) + 1000000, "the FSM did not finish");
    if (monitor_error) break;
    Action a = fsm.advance();
    if (a.kind == ActionKind::Done) break;
    if (a.kind == ActionKind::Wait) { std::this_thread::yield(); continue; }
    expect(run.issued_at[a.id] == -1, "action " + std::to_string(a.id) + " issued twice");
    run.issued_at[a.id] = clock.fetch_add(1);
    if (threaded && a.stream == int32_t(Stream::Comm)) {
      expect(ring.push(a.id), "ring full");
    } else {
      finish(a.id);
    }
  }
  stop.store(true, std::memory_order_release);
  if (monitor.joinable()) monitor.join();
  if (monitor_error) std::rethrow_exception(monitor_error);
  for (size_t i = 0; i < n; ++i) run.completed_at[i] = completed[i].load();
  return run;
}

void check_order(const Program& prog, const Run& run) {
  const auto& code = prog.code;
  int64_t last_plain_issue = -1;
  for (size_t i = 0; i < code.size(); ++i) {
    const Instr& ins = code[i];
    if (completes(ins.op))
      expect(run.issued_at[i] >= 0 && run.completed_at[i] >= 0, "instruction " + std::to_string(i) + " never ran");
    if (ins.op == Op::Run || ins.op == Op::Send || ins.op == Op::Recv || ins.op == Op::Collective) {
      expect(run.issued_at[i] > last_plain_issue, "instruction " + std::to_string(i) + " issued out of program order");
      last_plain_issue = run.issued_at[i];
    }
    if (ins.op == Op::Wait) {
      // Everything after the WAIT starts after its target finished.
      for (size_t j = i + 1; j < code.size(); ++j)
        if ((code[j].op == Op::Run || code[j].op == Op::Send || code[j].op == Op::Recv || code[j].op == Op::Collective)) {
          expect(run.issued_at[j] > run.completed_at[ins.a], "instruction " + std::to_string(j) + " started before WAIT " +
                                                                 std::to_string(i) + "'s target finished");
          break;
        }
    }
    if (ins.op == Op::Defer) {
      // Issued no later than the first instruction at or after its deadline that issues work.
      for (size_t j = ins.b; j < code.size(); ++j)
        if (code[j].op == Op::Run || code[j].op == Op::Send || code[j].op == Op::Recv || code[j].op == Op::Collective) {
          expect(run.issued_at[i] < run.issued_at[j], "deferred task " + std::to_string(i) + " missed its deadline");
          break;
        }
    }
  }
}

int mutations(const std::vector<uint8_t>& bytes, uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  int refused = 0;
  for (int k = 0; k < count; ++k) {
    std::vector<uint8_t> m = bytes;
    switch (rng() % 3) {
      case 0:
        for (int f = 1 + int(rng() % 4); f > 0; --f) m[rng() % m.size()] ^= uint8_t(1u << (rng() % 8));
        break;
      case 1:
        m.resize(rng() % m.size());
        break;
      default: {  // a 32-bit field anywhere set to an extreme value
        size_t at = (rng() % (m.size() / 4)) * 4;
        uint32_t v = (rng() & 1) ? 0xFFFFFFFFu : uint32_t(rng() % 64);
        for (int b = 0; b < 4 && at + b < m.size(); ++b) m[at + b] = uint8_t(v >> (8 * b));
      }
    }
    if (m.size() >= kHeaderBytes && (rng() & 1)) {  // reseal, so checks past the checksum run
      uint32_t crc = crc32_of_plan(m.data(), m.size());
      for (int b = 0; b < 4; ++b) m[kChecksumOffset + b] = uint8_t(crc >> (8 * b));
    }
    try {
      auto prog = load_program(m.data(), m.size(), int64_t(rng() % 4), "");
      run_rank(prog, false, 0);
    } catch (const PlanError&) {
      ++refused;
    }
  }
  return refused;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s plan.tsb...\n", argv[0]);
    return 2;
  }
  try {
    int programs = 0, refused = 0, total_mutations = 0;
    for (int f = 1; f < argc; ++f) {
      std::vector<uint8_t> bytes = read_file(argv[f]);
      auto first = load_program(bytes.data(), bytes.size(), 0, "");
      for (uint32_t r = 0; r < first->plan.pp; ++r) {
        auto prog = load_program(bytes.data(), bytes.size(), r, "");
        check_order(*prog, run_rank(prog, false, 0));
        for (uint64_t seed = 0; seed < 3; ++seed) check_order(*prog, run_rank(prog, true, seed * 7919 + r));
        ++programs;
      }
      refused += mutations(bytes, uint64_t(f), 200);
      total_mutations += 200;
    }
    std::printf("runtime_selftest: %d programs ran single- and multi-threaded; %d of %d mutated plans refused, "
                "the rest ran to DONE\n", programs, refused, total_mutations);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "runtime_selftest: FAILED: %s\n", e.what());
    return 1;
  }
}
