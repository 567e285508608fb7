// The pair-schedule search: constructive schedules, then local search on stream orders.
//
// A pair DAG (passes/scheduling/pair_dag.py) is given as flat arrays: task i lasts dur[i]
// µs on stream res[i] (0 compute, 1 comm), waits for preds[i], belongs to side[i] (0
// forward, 1 backward), and, when it has one, must finish by deadline[i] (+inf: none).
// Tasks are numbered in a topological order of the dependencies.
//
// A schedule is held as one task order per stream; its start times are the earliest that
// order and the dependencies allow (a semi-active schedule), so the makespan is the
// longest path through the dependencies plus the stream orders.
//
// The search (pair_search.cpp has the details):
//   1. constructive schedules: event-driven list scheduling of the non-movable backbone with
//      movable tasks back-filled into idle gaps, and serial generation with insertion, each
//      under four priority rules, each improved by forward-backward justification; then each
//      rule with look-ahead by bound (start the ready task whose start gives the lowest lower
//      bound on the makespan rather than wait, when that beats waiting), searched from last;
//   2. merge search: the order of the stream with fewer tasks (the All-to-All stream: a merge
//      of the forward and backward transfer chains), started from the two chains spread into
//      each other (each into the other, at several phases), is improved by moving one of its
//      tasks at a time (two at a time on a short stream when no single move passes the
//      bound), the other stream re-fitted around each candidate order;
//   3. critical reinsertion: a task on the critical path is taken out of its stream's order
//      and put back where the makespan drops most, until no such move is left.
// Phases 2 and 3 alternate while they improve. Where the best schedule starts no transfer at
// time 0, the search runs once more from the schedules that feed the forward's first transfer
// first; from the best schedule with its longest weight gradient moved a few places later where
// it holds up the next task on the compute stream (delay_long_movable); for a compute-bound
// pair, once more from the best schedule with each fit also
// list-scheduling by bound; last, from the best schedule, two neighbouring transfers swapped at
// two places at once (swap_pairs). The search stops as soon as the makespan
// reaches the lower bound (it is then optimal). Each stream order is fitted once per search:
// asked again (about seven asks in eight), the kept answer is handed back; so is each
// schedule's justification (about four asks in five are repeats). Everything is
// deterministic: ties are broken by task number, there is no randomness and no clock.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace tessera::pair {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Dag {
  int n = 0;
  std::vector<double> dur;
  std::vector<int> res;   // 0 compute, 1 comm
  std::vector<int> side;  // 0 forward, 1 backward
  std::vector<char> movable;
  std::vector<double> deadline;  // kInf: none
  std::vector<std::vector<int>> preds, succs;
  // Ancestors of each task through the dependencies, as bitsets of `words` 64-bit words.
  int words = 0;
  std::vector<uint64_t> anc;

  bool ancestor(int a, int b) const { return (anc[size_t(b) * words + a / 64] >> (a % 64)) & 1; }
  // Builds succs and anc; throws std::invalid_argument when preds are not topologically numbered.
  void finish();
};

struct Options {
  int merge_iterations = 30;  // steps of the merge search per round
  int merge_patience = 10;    // merge steps in a row without a better schedule before giving up
  int merge_phases = 8;       // evenly spread merges tried as starting points
  int merge_span = 0;         // how far one merge step may move a task (0: anywhere)
  int starts = 1;             // constructive schedules the local search starts from
  int rounds = 4;             // alternations of merge search and critical reinsertion
  int reinsert_rounds = 200;  // improving moves of critical reinsertion per round, at most
};

struct Stats {
  std::string rule;       // what produced the best schedule
  long evaluations = 0;   // stream-order evaluations
  long fits = 0;          // schedules fitted around a fixed stream order
  long fit_reuses = 0;    // fits answered from the ones this search already made
  long reinsert_reuses = 0;  // critical reinsertions replayed from orders already searched from
  long justify_reuses = 0;   // justifications handed back from the ones this search already made
  int candidates = 0;     // constructive schedules tried
  long merge_steps = 0;   // steps of the merge search
  int last_gain = 0;      // the merge step that last improved the best schedule
  double lower_bound = 0.0;
};

// Lower bound of every schedule: the busier stream, the longest dependency chain, and for
// each stream Jackson's preemptive schedule with heads and tails.
double lower_bound(const Dag& g);

// The best schedule found (start times); `initial` are further schedules to start from
// (start times of valid schedules, e.g. a hand-written template). Throws
// std::runtime_error when no schedule meets the deadlines.
std::vector<double> search(const Dag& g, const std::vector<std::vector<double>>& initial, const Options& opt,
                           Stats& stats);

}  // namespace tessera::pair
