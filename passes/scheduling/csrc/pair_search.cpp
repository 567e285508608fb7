// The pair-schedule search (see pair_search.h for the outline).
#include "pair_search.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <queue>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace tessera::pair {

void Dag::finish() {
  succs.assign(size_t(n), {});
  for (int i = 0; i < n; ++i)
    for (int p : preds[size_t(i)]) {
      if (p < 0 || p >= i) throw std::invalid_argument("task dependencies must point to earlier tasks");
      succs[size_t(p)].push_back(i);
    }
  words = (n + 63) / 64;
  anc.assign(size_t(n) * size_t(words), 0);
  for (int i = 0; i < n; ++i)
    for (int p : preds[size_t(i)]) {
      uint64_t* row = &anc[size_t(i) * words];
      const uint64_t* from = &anc[size_t(p) * words];
      for (int w = 0; w < words; ++w) row[w] |= from[w];
      row[p / 64] |= uint64_t(1) << (p % 64);
    }
}

namespace {

// Slack when comparing times: far below any duration, far above the rounding of summed floats.
constexpr double kEps = 1e-9;

using Times = std::vector<double>;
using Busy = std::vector<std::pair<double, double>>;  // sorted, non-overlapping [start, end) intervals

double makespan_of(const Dag& g, const Times& start) {
  double ms = 0.0;
  for (int i = 0; i < g.n; ++i) ms = std::max(ms, start[size_t(i)] + g.dur[size_t(i)]);
  return ms;
}

bool meets_deadlines(const Dag& g, const Times& start) {
  for (int i = 0; i < g.n; ++i)
    if (start[size_t(i)] + g.dur[size_t(i)] > g.deadline[size_t(i)] + kEps) return false;
  return true;
}

// Tasks by (start, finish, number).
std::vector<int> time_order(const Dag& g, const Times& start) {
  std::vector<int> order(size_t(g.n));
  for (int i = 0; i < g.n; ++i) order[size_t(i)] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    double sa = start[size_t(a)], sb = start[size_t(b)];
    if (sa != sb) return sa < sb;
    double fa = sa + g.dur[size_t(a)], fb = sb + g.dur[size_t(b)];
    if (fa != fb) return fa < fb;
    return a < b;
  });
  return order;
}

Times heads(const Dag& g) {
  Times head(size_t(g.n), 0.0);
  for (int i = 0; i < g.n; ++i)
    for (int p : g.preds[size_t(i)]) head[size_t(i)] = std::max(head[size_t(i)], head[size_t(p)] + g.dur[size_t(p)]);
  return head;
}

// Longest path from each task to the end, its own weight included.
Times bottom_levels(const Dag& g, const Times& weight) {
  Times bl(size_t(g.n), 0.0);
  for (int i = g.n - 1; i >= 0; --i) {
    double best = 0.0;
    for (int s : g.succs[size_t(i)]) best = std::max(best, bl[size_t(s)]);
    bl[size_t(i)] = weight[size_t(i)] + best;
  }
  return bl;
}

double one_stream_bound(const Dag& g, int r, const Times& head, const Times& bl) {
  std::vector<int> members;
  for (int i = 0; i < g.n; ++i)
    if (g.res[size_t(i)] == r) members.push_back(i);
  std::sort(members.begin(), members.end(), [&](int a, int b) {
    return head[size_t(a)] != head[size_t(b)] ? head[size_t(a)] < head[size_t(b)] : a < b;
  });
  Times remaining = g.dur;
  using Item = std::pair<double, int>;  // (tail, task): the longest tail first, then the lower number
  auto cmp = [](const Item& x, const Item& y) { return x.first != y.first ? x.first < y.first : x.second > y.second; };
  std::priority_queue<Item, std::vector<Item>, decltype(cmp)> heap(cmp);
  double t = 0.0, bound = 0.0;
  size_t k = 0;
  while (k < members.size() || !heap.empty()) {
    if (heap.empty()) t = std::max(t, head[size_t(members[k])]);
    while (k < members.size() && head[size_t(members[k])] <= t + kEps) {
      int i = members[k++];
      heap.push({bl[size_t(i)] - g.dur[size_t(i)], i});
    }
    Item top = heap.top();
    heap.pop();
    int i = top.second;
    double next_release = k < members.size() ? head[size_t(members[k])] : kInf;
    double run = std::min(remaining[size_t(i)], std::max(0.0, next_release - t));
    t += run;
    remaining[size_t(i)] -= run;
    if (remaining[size_t(i)] > kEps)
      heap.push(top);
    else
      bound = std::max(bound, t + top.first);
  }
  return bound;
}

// ---------------------------------------------------------------- placement on streams

double earliest_fit(const Busy& busy, double ready, double duration) {
  if (busy.empty() || busy.back().second <= ready + kEps) return ready;
  double t = ready;
  for (const auto& [s, e] : busy) {
    if (e <= t + kEps) continue;
    if (t + duration <= s + kEps) return t;
    if (e > t) t = e;
  }
  return t;
}

void occupy(Busy& busy, double start, double duration) {
  std::pair<double, double> iv{start, start + duration};
  if (busy.empty() || !(iv < busy.back()))
    busy.push_back(iv);
  else
    busy.insert(std::upper_bound(busy.begin(), busy.end(), iv), iv);
}

// Serial generation with insertion: tasks in `order` (topological for `preds` plus the
// optional one extra predecessor per task), each at the earliest gap of its stream after its
// predecessors finished.
Times serial_generation(const Dag& g, const std::vector<int>& order, const std::vector<std::vector<int>>& preds,
                        const std::vector<int>* extra = nullptr) {
  Times start(size_t(g.n), 0.0), finish(size_t(g.n), 0.0);
  Busy lines[2];
  for (int i : order) {
    double ready = 0.0;
    for (int p : preds[size_t(i)]) ready = std::max(ready, finish[size_t(p)]);
    if (extra && (*extra)[size_t(i)] >= 0) ready = std::max(ready, finish[size_t((*extra)[size_t(i)])]);
    Busy& busy = lines[g.res[size_t(i)]];
    double s = earliest_fit(busy, ready, g.dur[size_t(i)]);
    occupy(busy, s, g.dur[size_t(i)]);
    start[size_t(i)] = s;
    finish[size_t(i)] = s + g.dur[size_t(i)];
  }
  return start;
}

// A topological order that always takes the ready task of highest key (ties: lower number);
// `extra_succ`/`extra_pred` add one edge per task (a fixed stream order).
std::vector<int> priority_order(const Dag& g, const Times& key, const std::vector<int>* extra_pred = nullptr,
                                const std::vector<int>* extra_succ = nullptr) {
  std::vector<int> missing(size_t(g.n));
  for (int i = 0; i < g.n; ++i)
    missing[size_t(i)] = int(g.preds[size_t(i)].size()) + (extra_pred && (*extra_pred)[size_t(i)] >= 0 ? 1 : 0);
  auto cmp = [&](int a, int b) { return key[size_t(a)] != key[size_t(b)] ? key[size_t(a)] < key[size_t(b)] : a > b; };
  std::priority_queue<int, std::vector<int>, decltype(cmp)> heap(cmp);
  for (int i = 0; i < g.n; ++i)
    if (missing[size_t(i)] == 0) heap.push(i);
  std::vector<int> out;
  out.reserve(size_t(g.n));
  while (!heap.empty()) {
    int i = heap.top();
    heap.pop();
    out.push_back(i);
    for (int s : g.succs[size_t(i)])
      if (--missing[size_t(s)] == 0) heap.push(s);
    if (extra_succ && (*extra_succ)[size_t(i)] >= 0) {
      int s = (*extra_succ)[size_t(i)];
      if (--missing[size_t(s)] == 0) heap.push(s);
    }
  }
  return out;
}

// Forward-backward improvement: right-justify (the reversed DAG, latest finish first), then
// left-justify in the order of the right-justified starts; neither step lengthens the
// schedule, and together they often close gaps.
Times justify(const Dag& g, Times best, int rounds = 3) {
  double best_ms = makespan_of(g, best);
  for (int round = 0; round < rounds; ++round) {
    std::vector<int> rorder(size_t(g.n));
    for (int i = 0; i < g.n; ++i) rorder[size_t(i)] = i;
    std::sort(rorder.begin(), rorder.end(), [&](int a, int b) {
      double fa = best[size_t(a)] + g.dur[size_t(a)], fb = best[size_t(b)] + g.dur[size_t(b)];
      if (fa != fb) return fa > fb;
      if (best[size_t(a)] != best[size_t(b)]) return best[size_t(a)] > best[size_t(b)];
      return a < b;
    });
    Times rstart = serial_generation(g, rorder, g.succs);
    double rms = makespan_of(g, rstart);
    Times back(size_t(g.n));
    for (int i = 0; i < g.n; ++i) back[size_t(i)] = rms - rstart[size_t(i)] - g.dur[size_t(i)];
    Times fstart = serial_generation(g, time_order(g, back), g.preds);
    double ms = makespan_of(g, fstart);
    if (ms < best_ms - kEps && meets_deadlines(g, fstart)) {
      best = std::move(fstart);
      best_ms = ms;
    } else {
      break;
    }
  }
  return best;
}

// ---------------------------------------------------------------- stream orders

struct Orders {
  std::vector<int> seq[2];
};

Orders orders_of(const Dag& g, const Times& start) {
  Orders o;
  for (int i : time_order(g, start)) o.seq[g.res[size_t(i)]].push_back(i);
  return o;
}

// Earliest starts under the dependencies plus the stream orders, and optionally each task's
// tail (the longest path from its end to the end of the schedule).
class Evaluator {
 public:
  explicit Evaluator(const Dag& g)
      : g_(g), next_(size_t(g.n)), prev_(size_t(g.n)), indeg_(size_t(g.n)), topo_(size_t(g.n)) {}

  // False when the orders contradict the dependencies (a cycle).
  bool run(const std::vector<int>& s0, const std::vector<int>& s1, Times& start, Times* tail, double& ms) {
    const int n = g_.n;
    std::fill(next_.begin(), next_.end(), -1);
    std::fill(prev_.begin(), prev_.end(), -1);
    for (const auto* seq : {&s0, &s1})
      for (size_t k = 1; k < seq->size(); ++k) {
        next_[size_t((*seq)[k - 1])] = (*seq)[k];
        prev_[size_t((*seq)[k])] = (*seq)[k - 1];
      }
    start.assign(size_t(n), 0.0);
    stack_.clear();
    for (int i = 0; i < n; ++i) {
      indeg_[size_t(i)] = int(g_.preds[size_t(i)].size()) + (prev_[size_t(i)] >= 0 ? 1 : 0);
      if (indeg_[size_t(i)] == 0) stack_.push_back(i);
    }
    std::vector<int>& stack = stack_;
    size_t done = 0;
    ms = 0.0;
    while (!stack.empty()) {
      int i = stack.back();
      stack.pop_back();
      topo_[done++] = i;
      double f = start[size_t(i)] + g_.dur[size_t(i)];
      if (f > ms) ms = f;
      for (int s : g_.succs[size_t(i)]) {
        if (f > start[size_t(s)]) start[size_t(s)] = f;
        if (--indeg_[size_t(s)] == 0) stack.push_back(s);
      }
      int j = next_[size_t(i)];
      if (j >= 0) {
        if (f > start[size_t(j)]) start[size_t(j)] = f;
        if (--indeg_[size_t(j)] == 0) stack.push_back(j);
      }
    }
    if (done != size_t(n)) return false;
    if (tail) {
      tail->assign(size_t(n), 0.0);
      for (size_t k = size_t(n); k-- > 0;) {
        int i = topo_[k];
        double t = 0.0;
        for (int s : g_.succs[size_t(i)]) t = std::max(t, g_.dur[size_t(s)] + (*tail)[size_t(s)]);
        int j = next_[size_t(i)];
        if (j >= 0) t = std::max(t, g_.dur[size_t(j)] + (*tail)[size_t(j)]);
        (*tail)[size_t(i)] = t;
      }
    }
    return true;
  }

 private:
  const Dag& g_;
  std::vector<int> next_, prev_, indeg_, topo_, stack_;
};

// ---------------------------------------------------------------- constructive schedules

constexpr int kNoLookahead = 0, kFit = 1, kBestFit = 2, kBound = 3;
// The longest stream order on which the merge search tries two moves at once when no single
// move passes its bound (the pairs of moves grow as the fourth power of the length).
constexpr int kPairedMovesMaxTasks = 12;
// The longest stream order on which the last phase tries every two swaps of neighbours (their
// number grows as the square of the length): the transfer streams of every reference plan's
// pairs but Qwen3-30B's 24-layer chunks (96 transfers, where it found nothing and cost 20% more fits).
constexpr int kSwapPairsMaxTasks = 32;
// How many places later delay_long_movable tries the longest weight gradient.
constexpr size_t kDelayPlaces = 4;

// Event-driven list scheduling of the backbone tasks: whenever a stream can start
// something, its ready task of highest priority goes; with look-ahead, a stream about to
// start a task while a more urgent one becomes ready shortly fills that window instead
// (with the most urgent task that fits it, else the one that overruns it least when the
// overrun is shorter than the window, else it waits for the urgent task; or, best-fit, with
// the task whose duration is closest to the window; or, by bound, with the ready task whose
// start now gives the lowest lower bound on the makespan, when that is below the bound of
// waiting: a long task that overruns the window costs nothing when the stream has more work
// left than the urgent task's path needs, while idle time always adds to the stream's end).
// `tail` (kBound only): each task's longest path from its end to the end of the schedule.
Times list_schedule(const Dag& g, const std::vector<char>& backbone, const Times& priority, int lookahead,
                    const std::vector<int>* extra_pred = nullptr, const std::vector<int>* extra_succ = nullptr,
                    const Times* tail = nullptr) {
  const int n = g.n;
  Times start(size_t(n), 0.0), ready_at(size_t(n), 0.0);
  double free_at[2] = {0.0, 0.0};
  double work_left[2] = {0.0, 0.0};  // durations of the backbone tasks not yet started, per stream
  std::vector<int> missing(size_t(n), -1);
  std::vector<int> pools[2];
  int left = 0;
  for (int i = 0; i < n; ++i) {
    if (!backbone[size_t(i)]) continue;
    ++left;
    work_left[g.res[size_t(i)]] += g.dur[size_t(i)];
    int m = 0;
    for (int p : g.preds[size_t(i)]) m += backbone[size_t(p)] ? 1 : 0;
    if (extra_pred && (*extra_pred)[size_t(i)] >= 0 && backbone[size_t((*extra_pred)[size_t(i)])]) ++m;
    missing[size_t(i)] = m;
    if (m == 0) pools[g.res[size_t(i)]].push_back(i);
  }
  auto better = [&](int a, int b) {  // higher priority first, then lower number
    return priority[size_t(a)] != priority[size_t(b)] ? priority[size_t(a)] > priority[size_t(b)] : a < b;
  };
  // Each stream's next choice depends only on its pool (and its members' ready times, fixed
  // once they join it), when the stream frees up, and the priorities: it is kept until one
  // of those changes, so an event decides again only for the stream that ran a task and a
  // stream that gained one.
  bool stale[2] = {true, true};
  double choice_begin[2] = {0.0, 0.0};
  int choice[2] = {-1, -1};
  while (left > 0) {
    bool found = false;
    double best_begin = 0.0;
    int best_r = 0, best_i = -1;
    for (int r = 0; r < 2; ++r) {
      const auto& cands = pools[r];
      if (cands.empty()) continue;
      if (!stale[r]) {
        bool take = !found || choice_begin[r] < best_begin ||
                    (choice_begin[r] == best_begin && (r < best_r || (r == best_r && better(choice[r], best_i))));
        if (take) {
          found = true;
          best_begin = choice_begin[r];
          best_r = r;
          best_i = choice[r];
        }
        continue;
      }
      double earliest = kInf;
      for (int i : cands) earliest = std::min(earliest, ready_at[size_t(i)]);
      double t = std::max(free_at[r], earliest);
      int chosen = -1;
      for (int i : cands)
        if (ready_at[size_t(i)] <= t + kEps && (chosen < 0 || better(i, chosen))) chosen = i;
      double begin = t;
      if (lookahead) {
        int urgent = -1;
        for (int i : cands) {
          if (ready_at[size_t(i)] <= t + kEps || priority[size_t(i)] <= priority[size_t(chosen)]) continue;
          if (urgent < 0 || priority[size_t(i)] > priority[size_t(urgent)] ||
              (priority[size_t(i)] == priority[size_t(urgent)] &&
               (ready_at[size_t(i)] < ready_at[size_t(urgent)] ||
                (ready_at[size_t(i)] == ready_at[size_t(urgent)] && i < urgent))))
            urgent = i;
        }
        if (urgent >= 0) {
          double window = ready_at[size_t(urgent)] - t;
          int fit = -1, over = -1;
          for (int i : cands) {
            if (ready_at[size_t(i)] > t + kEps) continue;
            if (g.dur[size_t(i)] <= window + kEps && (fit < 0 || better(i, fit))) fit = i;
            if (over < 0 || g.dur[size_t(i)] < g.dur[size_t(over)] || (g.dur[size_t(i)] == g.dur[size_t(over)] && i < over))
              over = i;
          }
          if (lookahead == kBound) {
            // Waiting: the stream idles until the urgent task is ready, then still has all its work.
            const Times& tl = *tail;
            auto bound_from = [&](double at, int first, int then) {
              double b = std::max(at + work_left[r], at + g.dur[size_t(first)] + tl[size_t(first)]);
              if (then >= 0) b = std::max(b, at + g.dur[size_t(first)] + g.dur[size_t(then)] + tl[size_t(then)]);
              return b;
            };
            double wait_bound = bound_from(ready_at[size_t(urgent)], urgent, -1);
            int fill = -1;
            double fill_bound = kInf;
            for (int i : cands) {
              if (ready_at[size_t(i)] > t + kEps) continue;
              double b = bound_from(t, i, urgent);
              if (fill < 0 || b < fill_bound - kEps || (std::abs(b - fill_bound) <= kEps && better(i, fill))) {
                fill = i;
                fill_bound = b;
              }
            }
            if (fill_bound < wait_bound - kEps) {
              chosen = fill;
            } else {
              chosen = urgent;
              begin = ready_at[size_t(urgent)];
            }
          } else if (lookahead == kBestFit) {
            // The task whose duration is closest to the window, idle left and overrun alike
            // (one long task that just overruns can beat a short one that leaves most of it idle).
            int close = -1;
            for (int i : cands) {
              if (ready_at[size_t(i)] > t + kEps) continue;
              double d = std::abs(window - g.dur[size_t(i)]);
              double dc = close < 0 ? kInf : std::abs(window - g.dur[size_t(close)]);
              if (close < 0 || d < dc || (d == dc && better(i, close))) close = i;
            }
            if (std::abs(window - g.dur[size_t(close)]) < window) {
              chosen = close;
            } else {
              chosen = urgent;
              begin = ready_at[size_t(urgent)];
            }
          } else if (fit >= 0) {
            chosen = fit;
          } else if (g.dur[size_t(over)] - window < window) {
            chosen = over;
          } else {
            chosen = urgent;
            begin = ready_at[size_t(urgent)];
          }
        }
      }
      stale[r] = false;
      choice_begin[r] = begin;
      choice[r] = chosen;
      bool take = !found || begin < best_begin ||
                  (begin == best_begin && (r < best_r || (r == best_r && better(chosen, best_i))));
      if (take) {
        found = true;
        best_begin = begin;
        best_r = r;
        best_i = chosen;
      }
    }
    int i = best_i;
    start[size_t(i)] = best_begin;
    double f = best_begin + g.dur[size_t(i)];
    free_at[best_r] = f;
    work_left[best_r] -= g.dur[size_t(i)];
    stale[best_r] = true;
    auto& pool = pools[best_r];
    pool.erase(std::find(pool.begin(), pool.end(), i));
    --left;
    auto release = [&](int s) {
      if (missing[size_t(s)] <= 0) return;
      ready_at[size_t(s)] = std::max(ready_at[size_t(s)], f);
      if (--missing[size_t(s)] == 0) {
        pools[g.res[size_t(s)]].push_back(s);
        stale[g.res[size_t(s)]] = true;
      }
    };
    for (int s : g.succs[size_t(i)]) release(s);
    if (extra_succ && (*extra_succ)[size_t(i)] >= 0) release((*extra_succ)[size_t(i)]);
  }
  return start;
}

// Movable (non-backbone) tasks into idle gaps of their stream: each into the earliest gap
// after its predecessors that holds it entirely; earliest-ready tasks first.
void backfill(const Dag& g, Times& start, const std::vector<char>& backbone, const Times& priority) {
  Busy lines[2];
  std::vector<char> placed(backbone);
  std::vector<int> pending;
  for (int i = 0; i < g.n; ++i) {
    if (placed[size_t(i)])
      occupy(lines[g.res[size_t(i)]], start[size_t(i)], g.dur[size_t(i)]);
    else
      pending.push_back(i);
  }
  while (!pending.empty()) {
    int best = -1;
    double best_ready = 0.0;
    for (int i : pending) {
      bool ok = true;
      double ready = 0.0;
      for (int p : g.preds[size_t(i)]) {
        if (!placed[size_t(p)]) {
          ok = false;
          break;
        }
        ready = std::max(ready, start[size_t(p)] + g.dur[size_t(p)]);
      }
      if (!ok) continue;
      if (best < 0 || ready < best_ready ||
          (ready == best_ready && (priority[size_t(i)] > priority[size_t(best)] ||
                                   (priority[size_t(i)] == priority[size_t(best)] && i < best)))) {
        best = i;
        best_ready = ready;
      }
    }
    int i = best;
    double s = earliest_fit(lines[g.res[size_t(i)]], best_ready, g.dur[size_t(i)]);
    start[size_t(i)] = s;
    occupy(lines[g.res[size_t(i)]], s, g.dur[size_t(i)]);
    placed[size_t(i)] = 1;
    pending.erase(std::find(pending.begin(), pending.end(), i));
  }
}

// One backbone-first gap-fit pass. The backbone is every task that is not movable, plus
// movable tasks promoted because they missed their deadline, plus (integrated) every task.
Times backbone_gap_fit(const Dag& g, Times priority, const std::vector<char>& promoted, int lookahead,
                       bool integrated, const Times* tail = nullptr) {
  const int n = g.n;
  std::vector<char> backbone(static_cast<size_t>(n));
  bool any_promoted = false;
  for (int i = 0; i < n; ++i) {
    backbone[size_t(i)] = integrated || !g.movable[size_t(i)] || promoted[size_t(i)];
    any_promoted = any_promoted || promoted[size_t(i)];
  }
  // A backbone task that waits for a movable one pulls it into the backbone.
  for (int i = n - 1; i >= 0; --i)
    if (backbone[size_t(i)])
      for (int p : g.preds[size_t(i)]) backbone[size_t(p)] = 1;
  if (any_promoted) {
    double boost = *std::max_element(priority.begin(), priority.end()) + 1.0;
    for (int i = 0; i < n; ++i)
      if (promoted[size_t(i)]) priority[size_t(i)] += boost;
  }
  Times start = list_schedule(g, backbone, priority, lookahead, nullptr, nullptr, tail);
  if (std::find(backbone.begin(), backbone.end(), 0) != backbone.end()) backfill(g, start, backbone, priority);
  return start;
}

// The list-scheduling variants every priority rule is tried with.
struct Variant {
  const char* suffix;
  int lookahead;
  bool integrated;
};
constexpr Variant kVariants[] = {{"", kNoLookahead, false},
                                 {"/lookahead", kFit, false},
                                 {"/integrated", kFit, true},
                                 {"/best-fit", kBestFit, true}};

// ---------------------------------------------------------------- the search

// FNV-1a over a stream order's task numbers (-1 may separate two orders in one key).
uint64_t order_hash(const std::vector<int>& order) {
  uint64_t h = 1469598103934665603ull;
  for (int x : order) h = (h ^ uint64_t(uint32_t(x))) * 1099511628211ull;
  return h;
}


class Search {
 public:
  Search(const Dag& g, const Options& opt, Stats& stats) : g_(g), opt_(opt), stats_(stats), eval_(g) {
    stats_.lower_bound = lower_bound(g);
    target_ = stats_.lower_bound + kEps * std::max(1.0, stats_.lower_bound);
    double work[2] = {0.0, 0.0};
    for (int i = 0; i < g.n; ++i) work[g.res[size_t(i)]] += g.dur[size_t(i)];
    compute_bound_ = work[0] > work[1];
  }

  Times run(const std::vector<std::vector<double>>& initial) {
    construct(initial);
    if (best_.empty())
      throw std::runtime_error("no schedule of the pair meets the deadlines of its movable tasks");
    int fewer = count(0) < count(1) ? 0 : 1;
    // Local search from each of the best few constructive schedules: they lead to different
    // local optima.
    search_from(starts_, opt_.starts, fewer);
    // Then from the best look-ahead-by-bound schedule (see construct), when it is shorter than
    // every other start (it then leads where the others' searches do not).
    auto best_bound = std::min_element(bound_starts_.begin(), bound_starts_.end(),
                                       [](const auto& x, const auto& y) { return x.first < y.first; });
    double best_start = starts_.empty() ? kInf : starts_.front().first;
    if (best_bound != bound_starts_.end() && !done() && best_bound->first < best_start - kEps)
      local_search(std::move(best_bound->second), best_bound->first, fewer);
    // Then, where the best schedule leaves the comm stream idle at the start (the backward
    // opens with a long computation, such as the LM head's, before its first transfer), from
    // each schedule that feeds the forward's first transfer first (see construct_feed_first):
    // their local optima differ, and the best need not come from the shortest start.
    if (!done() && comm_starts_late(best_)) {
      construct_feed_first();
      search_from(feed_starts_, std::numeric_limits<int>::max(), fewer);
    }
    // Then the best schedule's longest weight gradient started later (see delay_long_movable).
    if (!done()) delay_long_movable(fewer);
    // Last, for a pair whose compute stream has the more work: the local search once more from
    // the best schedule, each fit also trying look-ahead by bound (a long weight gradient
    // started in a wait rather than the stream left idle) and keeping the shorter. Only the
    // best schedule can change, and only for the better.
    if (compute_bound_ && !done()) {
      bound_fit_ = true;
      local_search(best_, best_ms_, fewer);
      bound_fit_ = false;
    }
    // Last of all, two swaps at once on the best schedule's transfer order (see swap_pairs),
    // and the local search again from each one that helps.
    bound_fit_ = compute_bound_;
    for (int round = 0; round < opt_.rounds && !done() && count(fewer) <= kSwapPairsMaxTasks && swap_pairs(fewer);
         ++round)
      local_search(best_, best_ms_, fewer);
    bound_fit_ = false;
    return best_;
  }

 private:
  // Local search from each of `starts` with a distinct makespan, shortest first, `limit` at most.
  void search_from(std::vector<std::pair<double, Times>>& starts, int limit, int fewer) {
    std::stable_sort(starts.begin(), starts.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    int runs = 0;
    double last = -kInf;
    for (auto& [ms, start] : starts) {
      if (runs >= limit || done()) break;
      if (ms <= last + kEps * std::max(1.0, ms)) continue;
      last = ms;
      ++runs;
      local_search(std::move(start), ms, fewer);
    }
  }

  // Alternating critical reinsertion and merge search from one starting schedule.
  void local_search(Times start, double ms, int fewer) {
    cur_ = std::move(start);
    cur_ms_ = ms;
    for (int round = 0; round < opt_.rounds && !done(); ++round) {
      double before = cur_ms_;
      reinsert();
      if (!done()) merge_search(fewer);
      if (cur_ms_ >= before - kEps) break;
    }
    if (!done()) reinsert();
  }

  int count(int r) const { return int(std::count(g_.res.begin(), g_.res.end(), r)); }

  // Whether no transfer starts at the beginning of `start` (every comm task later than 0).
  bool comm_starts_late(const Times& start) const {
    double first = kInf;
    for (int i = 0; i < g_.n; ++i)
      if (g_.res[size_t(i)] == 1 && g_.dur[size_t(i)] > 0.0) first = std::min(first, start[size_t(i)]);
    return first != kInf && first > kEps * std::max(1.0, makespan_of(g_, start));
  }
  bool done() const { return best_ms_ <= target_; }

  // `justify` of `start`, each distinct schedule justified once per search: the search asks
  // for the same ones again and again (about four asks in five, mostly fits handed back from
  // the fit memo). Keyed by the doubles' bits, so a schedule that only compares equal (a
  // -0.0 for a 0.0) is justified afresh and the answer is bit for bit what justify gives.
  Times justified(Times start) {
    auto [entry, fresh] = justify_memo_.try_emplace(std::move(start));
    if (fresh)
      entry->second = justify(g_, entry->first);
    else
      ++stats_.justify_reuses;
    return entry->second;
  }

  // A constructive schedule: kept as a starting point (in `starts`, by default the main
  // ones), and as the best when it is.
  void consider(Times cand, const std::string& rule, std::vector<std::pair<double, Times>>* starts = nullptr) {
    ++stats_.candidates;
    double ms = makespan_of(g_, cand);
    if (ms <= best_ms_ * 1.01) {
      cand = justified(std::move(cand));
      ms = makespan_of(g_, cand);
    }
    if (!meets_deadlines(g_, cand)) return;
    (starts ? *starts : starts_).emplace_back(ms, cand);
    if (ms < best_ms_ - kEps) {
      best_ = std::move(cand);
      best_ms_ = ms;
      stats_.rule = rule;
    }
  }

  // A better schedule for the current local search, and the best overall when it is.
  void improve(const Times& start, double ms, const char* rule) {
    cur_ = start;
    cur_ms_ = ms;
    if (ms < best_ms_ - kEps) {
      best_ = start;
      best_ms_ = ms;
      stats_.rule = rule;
    }
  }

  void construct(const std::vector<std::vector<double>>& initial) {
    const int n = g_.n;
    Times ones(size_t(n), 1.0), bl = bottom_levels(g_, g_.dur);
    double comp = 0.0, comm = 0.0;
    for (int i = 0; i < n; ++i) (g_.res[size_t(i)] == 0 ? comp : comm) += g_.dur[size_t(i)];
    int bottleneck = comp >= comm ? 0 : 1;
    Times on_bottleneck(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) on_bottleneck[size_t(i)] = g_.res[size_t(i)] == bottleneck ? g_.dur[size_t(i)] : 0.0;
    Times blb = bottom_levels(g_, on_bottleneck);
    double scale = 1.0;
    for (double x : bl) scale = std::max(scale, x);
    struct Rule {
      const char* name;
      Times key;
    };
    std::vector<Rule> rules(4);
    rules[0] = {"bottom-level", bl};
    rules[1] = {"bottleneck-work", bl};
    rules[2] = {"backward-first", bl};
    rules[3] = {"forward-first", bl};
    for (int i = 0; i < n; ++i) {
      rules[1].key[size_t(i)] += blb[size_t(i)];
      rules[2].key[size_t(i)] += g_.side[size_t(i)] == 1 ? scale : 0.0;
      rules[3].key[size_t(i)] += g_.side[size_t(i)] == 0 ? scale : 0.0;
    }
    for (const auto& start : initial)
      if (start.size() == size_t(n)) {
        Times semi;
        double ms;
        Orders o = orders_of(g_, start);
        if (eval_.run(o.seq[0], o.seq[1], semi, nullptr, ms)) consider(semi, "given");
      }
    std::vector<char> promoted(size_t(n), 0);
    for (const auto& rule : rules) {
      for (const auto& v : kVariants) {
        Times start = backbone_gap_fit(g_, rule.key, promoted, v.lookahead, v.integrated);
        // A movable task that missed its deadline joins the backbone and the pass is retried;
        // each retry promotes at least one more task, so this ends.
        while (!v.integrated) {
          bool grew = false;
          for (int i = 0; i < n; ++i)
            if (!promoted[size_t(i)] && start[size_t(i)] + g_.dur[size_t(i)] > g_.deadline[size_t(i)] + kEps) {
              promoted[size_t(i)] = 1;
              grew = true;
            }
          if (!grew) break;
          start = backbone_gap_fit(g_, rule.key, promoted, v.lookahead, v.integrated);
        }
        consider(std::move(start), std::string(rule.name) + v.suffix);
        if (done()) return;
      }
      consider(serial_generation(g_, priority_order(g_, rule.key), g_.preds), rule.name);
      if (done()) return;
    }
    // Look-ahead by bound, under each rule: kept apart from the starts above (which it would
    // otherwise crowd out of the best few, changing where their local searches lead) and
    // searched from once they are done, so the result is never worse than without it.
    Times tail(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) tail[size_t(i)] = bl[size_t(i)] - g_.dur[size_t(i)];
    std::vector<char> none(size_t(n), 0);
    for (const auto& rule : rules) {
      Times start = backbone_gap_fit(g_, rule.key, none, kBound, true, &tail);
      consider(std::move(start), std::string(rule.name) + "/bound", &bound_starts_);
      if (done()) return;
    }
  }

  // Forward feed first: the forward's tasks up to its first transfer ahead of everything
  // else, then by bottom level, so that the comm stream starts early (under each variant).
  // Kept apart from the main starts, like the schedules by bound: run searches from them only
  // where the comm stream starts late, so every other pair's search is unchanged.
  void construct_feed_first() {
    const int n = g_.n;
    int first_comm = -1;
    for (int i = 0; i < n && first_comm < 0; ++i)
      if (g_.side[size_t(i)] == 0 && g_.res[size_t(i)] == 1) first_comm = i;
    if (first_comm < 0) return;
    Times feed = bottom_levels(g_, g_.dur);
    double scale = 1.0;
    for (double x : feed) scale = std::max(scale, x);
    for (int i = 0; i < n; ++i)
      if (i == first_comm || g_.ancestor(i, first_comm)) feed[size_t(i)] += scale;
    std::vector<char> none(size_t(n), 0);
    for (const auto& v : kVariants) {
      consider(backbone_gap_fit(g_, feed, none, v.lookahead, v.integrated), std::string("forward-feed") + v.suffix,
               &feed_starts_);
      if (done()) return;
    }
  }

  // ------------------------------------------------------------ merge search

  // Schedule with stream `fixed` running `chain` in this order: the chain becomes extra
  // dependencies, and the tasks are list-scheduled event by event with look-ahead, the
  // ready task with the longest tail in that augmented DAG first (the work that feeds the
  // next transfer soonest), then justified. (Insertion in priority order, which places an
  // urgent task first even when it is released late, was several percent worse given the
  // optimal stream order.)
  //
  // A fit depends only on the chain and on whether it also tries look-ahead by bound, and the
  // search asks for the same chain again and again (each local search from a new start, each
  // round, the merges spread at each phase revisit orders an earlier one fitted: about seven
  // asks in eight on make demo's pairs), so each answer is kept for the rest of this search
  // and handed back as it was computed. The schedules are exactly the same; only the work is not.
  bool fit(const std::vector<int>& chain, Times& out, double& ms) {
    auto [entry, fresh] = fit_memo_[bound_fit_ ? 1 : 0].try_emplace(chain);
    FitAnswer& answer = entry->second;
    if (!fresh) {
      ++stats_.fit_reuses;
      if (answer.fitted) out = answer.out;
      if (answer.ok) ms = answer.ms;
      return answer.ok;
    }
    answer.ok = fit_once(chain, out, ms, answer.fitted);
    if (answer.fitted) answer.out = out;
    if (answer.ok) answer.ms = ms;
    return answer.ok;
  }

  // One fit as `fit` describes it; `fitted`: whether `out` was written (not when the chain
  // contradicts the dependencies).
  bool fit_once(const std::vector<int>& chain, Times& out, double& ms, bool& fitted) {
    ++stats_.fits;
    fitted = false;
    const int n = g_.n;
    std::vector<int>& extra_pred = fit_pred_;
    std::vector<int>& extra_succ = fit_succ_;
    extra_pred.assign(size_t(n), -1);
    extra_succ.assign(size_t(n), -1);
    for (size_t k = 1; k < chain.size(); ++k) {
      extra_pred[size_t(chain[k])] = chain[k - 1];
      extra_succ[size_t(chain[k - 1])] = chain[k];
    }
    // Tails in the augmented DAG: a topological order of it first. Any one does: a tail is
    // the longest path to the end, the same whichever order computes it.
    std::vector<int>& order = fit_order_;
    std::vector<int>& missing = fit_missing_;
    order.clear();
    missing.resize(size_t(n));
    for (int i = 0; i < n; ++i) {
      missing[size_t(i)] = int(g_.preds[size_t(i)].size()) + (extra_pred[size_t(i)] >= 0 ? 1 : 0);
      if (missing[size_t(i)] == 0) order.push_back(i);
    }
    for (size_t k = 0; k < order.size(); ++k) {  // `order` is its own queue
      int i = order[k];
      for (int s : g_.succs[size_t(i)])
        if (--missing[size_t(s)] == 0) order.push_back(s);
      int j = extra_succ[size_t(i)];
      if (j >= 0 && --missing[size_t(j)] == 0) order.push_back(j);
    }
    if (int(order.size()) != n) return false;  // the chain contradicts the dependencies
    Times& tail = fit_tail_;
    tail.assign(size_t(n), 0.0);
    for (size_t k = size_t(n); k-- > 0;) {
      int i = order[k];
      double t = 0.0;
      for (int s : g_.succs[size_t(i)]) t = std::max(t, g_.dur[size_t(s)] + tail[size_t(s)]);
      int j = extra_succ[size_t(i)];
      if (j >= 0) t = std::max(t, g_.dur[size_t(j)] + tail[size_t(j)]);
      tail[size_t(i)] = t;
    }
    out = list_schedule(g_, all_, tail, kFit, &extra_pred, &extra_succ);
    fitted = true;
    if (!meets_deadlines(g_, out)) return false;
    ms = makespan_of(g_, out);
    if (bound_fit_) {  // also by bound (see run), the shorter kept
      Times alt = list_schedule(g_, all_, tail, kBound, &extra_pred, &extra_succ, &tail);
      double alt_ms = makespan_of(g_, alt);
      if (alt_ms < ms && meets_deadlines(g_, alt)) {
        out = std::move(alt);
        ms = alt_ms;
      }
    }
    return true;
  }

  // Lower bound of every schedule whose stream runs `chain` in this order: the stream alone,
  // each task no earlier than its head, each followed by its tail.
  double chain_bound(const std::vector<int>& chain) const {
    double t = 0.0, bound = 0.0;
    for (int i : chain) {
      t = std::max(t, head_[size_t(i)]) + g_.dur[size_t(i)];
      bound = std::max(bound, t + tail_[size_t(i)]);
    }
    return bound;
  }

  // Where task `u` may go back into `base` (its stream's order without it): after its
  // ancestors and before its descendants, positions lo..hi.
  std::pair<size_t, size_t> move_range(const std::vector<int>& base, int u) const {
    size_t lo = 0, hi = base.size();
    for (size_t k = 0; k < base.size(); ++k) {
      if (g_.ancestor(base[k], u)) lo = k + 1;
      if (hi == base.size() && g_.ancestor(u, base[k])) hi = k;
    }
    return {lo, hi};
  }

  // Every order one move away from `order`: a task taken out and put back elsewhere, after
  // its ancestors and before its descendants on the stream.
  std::vector<std::vector<int>> single_moves(const std::vector<int>& order) const {
    std::vector<std::vector<int>> out;
    for (size_t a = 0; a < order.size(); ++a) {
      int u = order[a];
      std::vector<int> base = order;
      base.erase(base.begin() + long(a));
      auto [lo, hi] = move_range(base, u);
      for (size_t b = lo; b <= hi; ++b) {
        if (b == a) continue;
        out.push_back(base);
        out.back().insert(out.back().begin() + long(b), u);
      }
    }
    return out;
  }

  void merge_search(int fixed) {
    if (all_.empty()) {
      all_.assign(size_t(g_.n), 1);
      head_ = heads(g_);
      Times bl = bottom_levels(g_, g_.dur);
      tail_.resize(size_t(g_.n));
      for (int i = 0; i < g_.n; ++i) tail_[size_t(i)] = bl[size_t(i)] - g_.dur[size_t(i)];
    }
    std::vector<int> current = orders_of(g_, cur_).seq[fixed];
    const size_t m = current.size();
    if (m < 2) return;
    std::unordered_set<uint64_t> seen{order_hash(current)};
    std::vector<int> base, trial, best_trial;
    Times start, best_start;
    // Starting points: the two sides' transfers (each side's in its order) spread evenly
    // into each other at several phases; good merges keep the stream busy with one side's
    // transfer while the other side computes, and are close to these.
    {
      // The incumbent's own order, re-fitted: the fit places the other stream differently.
      double ms;
      if (fit(current, start, ms)) {
        start = justified(std::move(start));
        ms = makespan_of(g_, start);
        if (ms < cur_ms_ - kEps) {
          improve(start, ms, "merge-search");
        }
      }
    }
    std::vector<int> sides[2];
    for (int x : current) sides[g_.side[size_t(x)]].push_back(x);
    // Each side's chain is spread into the other's: which side leads matters as much as the
    // phase (two chains of equal length spread one way only ever start with the same side,
    // and a pair whose forward must feed the comm stream while a long backward task computes
    // needs the forward's transfer first).
    for (int spread = 0; spread < 2 && !sides[0].empty() && !sides[1].empty() && opt_.merge_phases > 0; ++spread) {
      // First the shorter chain (the guest) into the longer (the host), then the other way.
      bool zero_hosts = (sides[0].size() >= sides[1].size()) == (spread == 0);
      const auto& host = zero_hosts ? sides[0] : sides[1];
      const auto& guest = zero_hosts ? sides[1] : sides[0];
      size_t a = host.size(), b = guest.size();
      for (int phase = 0; phase < opt_.merge_phases && !done(); ++phase) {
        trial.clear();
        size_t used = 0;
        for (size_t k = 0; k < b; ++k) {
          size_t before = std::min(a, size_t(double(a) * (double(k) + double(phase) / opt_.merge_phases) / double(b)));
          while (used < before) trial.push_back(host[used++]);
          trial.push_back(guest[k]);
        }
        while (used < a) trial.push_back(host[used++]);
        uint64_t h = order_hash(trial);
        if (seen.count(h)) continue;
        seen.insert(h);
        double ms;
        if (!fit(trial, start, ms)) continue;
        start = justified(std::move(start));
        ms = makespan_of(g_, start);
        if (ms < cur_ms_ - kEps) {
          improve(start, ms, "merge-search");
          current = trial;
        }
      }
    }
    int stale = 0;  // steps since the best schedule last improved
    for (int it = 0; it < opt_.merge_iterations && stale < opt_.merge_patience && !done(); ++it) {
      double best_trial_ms = kInf;
      for (size_t a = 0; a < m; ++a) {
        int u = current[a];
        base = current;
        base.erase(base.begin() + long(a));
        // Positions that keep u after its ancestors and before its descendants on the stream.
        auto [lo, hi] = move_range(base, u);
        if (opt_.merge_span > 0) {
          lo = std::max(lo, a > size_t(opt_.merge_span) ? a - size_t(opt_.merge_span) : size_t(0));
          hi = std::min(hi, a + size_t(opt_.merge_span));
        }
        for (size_t b = lo; b <= hi; ++b) {
          if (b == a) continue;
          trial = base;
          trial.insert(trial.begin() + long(b), u);
          uint64_t h = order_hash(trial);
          if (seen.count(h)) continue;
          if (chain_bound(trial) >= cur_ms_ - kEps) continue;
          double ms;
          if (!fit(trial, start, ms)) continue;
          if (ms < best_trial_ms - kEps) {
            best_trial_ms = ms;
            best_trial = trial;
            best_start = start;
          }
        }
      }
      if (best_trial_ms == kInf && m <= size_t(kPairedMovesMaxTasks)) {
        // Every single move was cut by the bound (none can beat the current schedule): two
        // moves at once, on a short stream only. A long transfer of one side can need to move
        // past several of the other side's while a later one of its own moves the other way
        // (the forward kept going while the backward's long first transfer waits), and
        // either move alone delays the critical chain.
        for (const auto& first : single_moves(current))
          for (auto& second : single_moves(first)) {
            uint64_t h = order_hash(second);
            if (seen.count(h) || chain_bound(second) >= cur_ms_ - kEps) continue;
            seen.insert(h);
            double ms;
            if (!fit(second, start, ms)) continue;
            if (ms < best_trial_ms - kEps) {
              best_trial_ms = ms;
              best_trial = std::move(second);
              best_start = start;
            }
          }
      }
      if (best_trial_ms == kInf) break;
      best_start = justified(std::move(best_start));
      best_trial_ms = makespan_of(g_, best_start);
      current = best_trial;
      seen.insert(order_hash(current));
      ++stats_.merge_steps;
      ++stale;
      if (best_trial_ms < cur_ms_ - kEps) {
        stale = 0;
        improve(best_start, best_trial_ms, "merge-search");
        stats_.last_gain = int(stats_.merge_steps);
      }
    }
  }

  // Two swaps of neighbouring tasks at once in the best schedule's order of stream `fixed`, the
  // other stream re-fitted: the best schedule replaced by the shortest that beats it. Where a
  // transfer of each side must overtake one of the other side's at two places (the backward's
  // combine ahead of the forward's, and its dispatch ahead of the forward's next), each swap
  // alone holds up a chain the other one frees, so no single move of the merge search helps.
  // Returns whether the best schedule changed.
  bool swap_pairs(int fixed) {
    if (all_.empty()) return false;  // the merge search never ran: no heads and tails yet
    const std::vector<int> order = orders_of(g_, best_).seq[fixed];
    const size_t m = order.size();
    double found_ms = best_ms_;
    Times found, start;
    std::vector<int> trial;
    for (size_t a = 0; a + 3 < m; ++a) {
      if (g_.ancestor(order[a], order[a + 1])) continue;
      for (size_t b = a + 2; b + 1 < m; ++b) {
        if (g_.ancestor(order[b], order[b + 1])) continue;
        trial = order;
        std::swap(trial[a], trial[a + 1]);
        std::swap(trial[b], trial[b + 1]);
        if (chain_bound(trial) >= found_ms - kEps) continue;
        double ms;
        if (!fit(trial, start, ms) || ms >= found_ms - kEps) continue;
        found_ms = ms;
        found = start;
      }
    }
    if (found.empty()) return false;
    found = justified(std::move(found));
    double ms = makespan_of(g_, found);
    if (ms >= best_ms_ - kEps || !meets_deadlines(g_, found)) return false;
    improve(found, ms, "swap-pairs");
    return true;
  }

  // The local search from the best schedule with its longest movable compute task (the LM
  // head's weight gradient, in a chunk holding the head) moved one to kDelayPlaces places later
  // in the compute order, when that task holds up the next one: the constructive rules start it
  // in the first idle window of the stream, which it overruns, so the backbone task that becomes
  // ready meanwhile (the next layer's dgrad, on the path to a transfer) waits for it. Moved alone
  // it only moves the wait (no single move of the local search helps); the search from there
  // also moves the short tasks around it. Only the best schedule can change, and only for the
  // better.
  void delay_long_movable(int fewer) {
    int longest = -1;
    for (int i = 0; i < g_.n; ++i)
      if (g_.movable[size_t(i)] && g_.res[size_t(i)] == 0 &&
          (longest < 0 || g_.dur[size_t(i)] > g_.dur[size_t(longest)]))
        longest = i;
    if (longest < 0) return;
    const Times from = best_;
    const Orders o = orders_of(g_, from);
    const std::vector<int>& seq = o.seq[0];
    const size_t at = size_t(std::find(seq.begin(), seq.end(), longest) - seq.begin());
    if (at + 1 >= seq.size()) return;
    // Held up: the next task on the stream starts when the movable one ends, though its own
    // dependencies were done earlier.
    const int next = seq[at + 1];
    double ready = 0.0;
    for (int p : g_.preds[size_t(next)]) ready = std::max(ready, from[size_t(p)] + g_.dur[size_t(p)]);
    if (g_.movable[size_t(next)] || ready >= from[size_t(next)] - kEps * std::max(1.0, from[size_t(next)])) return;
    std::vector<int> trial;
    Times start;
    for (size_t k = 1; k <= kDelayPlaces && at + k < seq.size() && !done(); ++k) {
      trial = seq;
      std::rotate(trial.begin() + std::ptrdiff_t(at), trial.begin() + std::ptrdiff_t(at + 1),
                  trial.begin() + std::ptrdiff_t(at + k + 1));
      double ms;
      if (!eval_.run(trial, o.seq[1], start, nullptr, ms) || !meets_deadlines(g_, start)) continue;
      local_search(start, ms, fewer);
    }
  }

  // ------------------------------------------------------------ critical reinsertion

  // What it does depends only on the current schedule's two stream orders, and the local search
  // often calls it again on orders it already searched from (a round whose merge search changed
  // nothing ends where the next round's reinsertion starts, and the last one after the loop
  // starts there again), so each outcome is kept for the rest of this search and replayed.
  void reinsert() {
    Orders o = orders_of(g_, cur_);
    std::vector<int> key = o.seq[0];
    key.push_back(-1);
    key.insert(key.end(), o.seq[1].begin(), o.seq[1].end());
    // (the outcome stays empty when the orders contradict the dependencies)
    auto [entry, fresh] = reinsert_memo_.try_emplace(std::move(key));
    auto& outcome = entry->second;
    if (!fresh) {
      ++stats_.reinsert_reuses;
      const auto& [found_ms, found] = outcome;
      if (!found.empty() && found_ms < cur_ms_ - kEps && meets_deadlines(g_, found))
        improve(found, found_ms, "critical-reinsertion");
      return;
    }
    Times start, tail;
    double ms;
    if (!eval_.run(o.seq[0], o.seq[1], start, &tail, ms)) return;
    std::vector<int> base, trial;
    Times trial_start, base_start, base_tail;
    for (int move = 0; move < opt_.reinsert_rounds && ms > target_; ++move) {
      double tol = 1e-7 * ms;
      double best_ms = ms - kEps * std::max(1.0, ms);
      int best_u = -1;
      size_t best_b = 0;
      for (int u = 0; u < g_.n; ++u) {
        if (std::abs(start[size_t(u)] + g_.dur[size_t(u)] + tail[size_t(u)] - ms) > tol) continue;
        int r = g_.res[size_t(u)];
        const auto& seq = o.seq[r];
        size_t a = size_t(std::find(seq.begin(), seq.end(), u) - seq.begin());
        base = seq;
        base.erase(base.begin() + long(a));
        auto [lo, hi] = move_range(base, u);
        // A bound on every trial's makespan from the orders with `u` taken out (its stream
        // then holds it by its dependencies alone): that schedule's makespan, and the path
        // through `u` between its new neighbours (their earliest finish before it, their
        // tails after it). A trial gains edges only, so neither can be shorter in it; one whose
        // bound does not beat the best move so far is not evaluated (the margin covers the
        // rounding of summing in another order), and the move chosen is the same.
        double base_ms;
        bool bounded = r == 0 ? eval_.run(base, o.seq[1], base_start, &base_tail, base_ms)
                              : eval_.run(o.seq[0], base, base_start, &base_tail, base_ms);
        const double margin = 1e-9 * std::max(1.0, ms);
        for (size_t b = lo; b <= hi; ++b) {
          if (b == a) continue;
          if (bounded) {
            double head = base_start[size_t(u)], after = base_tail[size_t(u)];
            if (b > 0) {
              int p = base[b - 1];
              head = std::max(head, base_start[size_t(p)] + g_.dur[size_t(p)]);
            }
            if (b < base.size()) {
              int q = base[b];
              after = std::max(after, g_.dur[size_t(q)] + base_tail[size_t(q)]);
            }
            double bound = std::max(base_ms, head + g_.dur[size_t(u)] + after);
            if (bound >= best_ms + margin) continue;
          }
          trial = base;
          trial.insert(trial.begin() + long(b), u);
          double trial_ms;
          ++stats_.evaluations;
          bool ok = r == 0 ? eval_.run(trial, o.seq[1], trial_start, nullptr, trial_ms)
                           : eval_.run(o.seq[0], trial, trial_start, nullptr, trial_ms);
          if (!ok || trial_ms >= best_ms || !meets_deadlines(g_, trial_start)) continue;
          best_ms = trial_ms;
          best_u = u;
          best_b = b;
        }
      }
      if (best_u < 0) break;
      auto& seq = o.seq[g_.res[size_t(best_u)]];
      seq.erase(std::find(seq.begin(), seq.end(), best_u));
      seq.insert(seq.begin() + long(best_b), best_u);
      eval_.run(o.seq[0], o.seq[1], start, &tail, ms);
    }
    outcome = {ms, start};
    if (ms < cur_ms_ - kEps && meets_deadlines(g_, start)) {
      improve(start, ms, "critical-reinsertion");
    }
  }

  const Dag& g_;
  const Options& opt_;
  Stats& stats_;
  Evaluator eval_;
  double target_ = 0.0;
  bool compute_bound_ = false;  // the compute stream has more work than the comm stream
  bool bound_fit_ = false;      // fit also tries list scheduling with look-ahead by bound
  Times best_, cur_;
  double best_ms_ = kInf, cur_ms_ = kInf;
  std::vector<std::pair<double, Times>> starts_;  // constructive schedules and their makespans
  std::vector<std::pair<double, Times>> bound_starts_;  // those made with look-ahead by bound
  std::vector<std::pair<double, Times>> feed_starts_;   // those feeding the forward's first transfer first
  Times head_, tail_;
  std::vector<char> all_;
  std::vector<int> fit_pred_, fit_succ_, fit_order_, fit_missing_;
  struct FitAnswer {
    bool ok = false, fitted = false;
    double ms = 0.0;
    Times out;
  };
  struct ChainHash {
    size_t operator()(const std::vector<int>& v) const { return size_t(order_hash(v)); }
  };
  struct TimesBits {  // hash and equality of start times by their bits
    static uint64_t bits(double x) {
      uint64_t b;
      std::memcpy(&b, &x, sizeof b);
      return b;
    }
    size_t operator()(const Times& v) const {
      uint64_t h = 1469598103934665603ull;
      for (double x : v) h = (h ^ bits(x)) * 1099511628211ull;
      return size_t(h);
    }
    bool operator()(const Times& a, const Times& b) const {
      return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
    }
  };
  // Justified schedules by the schedule justified (see `justified`).
  std::unordered_map<Times, Times, TimesBits, TimesBits> justify_memo_;
  // Outcomes of `reinsert` (the makespan and start times it ended with) by its starting orders.
  std::unordered_map<std::vector<int>, std::pair<double, Times>, ChainHash> reinsert_memo_;
  // Answers of `fit` by chain, without and with look-ahead by bound.
  std::unordered_map<std::vector<int>, FitAnswer, ChainHash> fit_memo_[2];
  Times fit_tail_;
};

}  // namespace

double lower_bound(const Dag& g) {
  double totals[2] = {0.0, 0.0};
  for (int i = 0; i < g.n; ++i) totals[g.res[size_t(i)]] += g.dur[size_t(i)];
  Times head = heads(g);
  double critical = 0.0;
  for (int i = 0; i < g.n; ++i) critical = std::max(critical, head[size_t(i)] + g.dur[size_t(i)]);
  Times bl = bottom_levels(g, g.dur);
  double bound = std::max({totals[0], totals[1], critical});
  for (int r = 0; r < 2; ++r) bound = std::max(bound, one_stream_bound(g, r, head, bl));
  return bound;
}

std::vector<double> search(const Dag& g, const std::vector<std::vector<double>>& initial, const Options& opt,
                           Stats& stats) {
  if (g.n == 0) return {};
  Search s(g, opt, stats);
  return s.run(initial);
}

}  // namespace tessera::pair
