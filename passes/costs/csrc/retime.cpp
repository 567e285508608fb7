// The contention model's event loop in C++: passes.costs._retime, called by
// passes.costs.contention.retime. It is the Python loop of contention.retime_reference
// statement for statement: the same operations on doubles in the same order (built without
// fused multiply-add contraction), so both give bitwise-identical times; tests compare them
// on thousands of random schedules. The caller checks the input and names the tasks.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace py = pybind11;

namespace {

struct Params {
  double sm_share_lost, comm_hbm_share, comm_slowdown_per_compute, comm_slowdown_per_memory;
  double cross_stream_sync_us, comm_wait_beside_compute_us, comm_latency_slowdown_per_compute;
  bool latency_bound_comm;
  double comm_gbps_beside_compute;
};

struct Task {
  double sm_util, mem_util, bandwidth_share, gbps;
};

// contention.capped
double capped(double rate, const Task& t, const Params& p) {
  const double cap = p.comm_gbps_beside_compute;
  if (cap > 0.0 && t.gbps > cap) return std::min(rate, cap / t.gbps);
  return rate;
}

// contention.compute_rate
double compute_rate(const Task& t, const Params& p, double share) {
  double rate = 1.0;
  if (t.sm_util > 0) rate = std::min(rate, (1.0 - p.sm_share_lost * share) / t.sm_util);
  if (t.mem_util > 0) rate = std::min(rate, (1.0 - p.comm_hbm_share * share) / t.mem_util);
  return rate;
}

// contention.comm_rate
double comm_rate(const Task& neighbour, const Params& p, double share) {
  double per_compute = p.comm_slowdown_per_compute;
  if (share < 1.0) per_compute = share * per_compute + (1.0 - share) * p.comm_latency_slowdown_per_compute;
  return 1.0 / (1.0 + per_compute * neighbour.sm_util + p.comm_slowdown_per_memory * neighbour.mem_util);
}

// (start, finish, indices in start order, indices in finish order, stuck stream heads): the
// last is empty unless the stream order deadlocks, when the others are partial.
using Result = std::tuple<std::vector<double>, std::vector<double>, std::vector<int>, std::vector<int>, std::vector<int>>;

Result retime(const std::vector<double>& duration, const std::vector<int>& stream, const std::vector<long long>& order,
              const std::vector<std::vector<int>>& deps_of, const std::vector<double>& sm_util,
              const std::vector<double>& mem_util, const std::vector<double>& bandwidth_share,
              const std::vector<double>& gbps, const Params& p) {
  const size_t n = duration.size();
  if (stream.size() != n || order.size() != n || deps_of.size() != n || sm_util.size() != n || mem_util.size() != n ||
      bandwidth_share.size() != n || gbps.size() != n)
    throw std::invalid_argument("every per-task list must have one entry per task");
  std::vector<Task> tasks(n);
  std::vector<int> streams[2];
  for (size_t i = 0; i < n; ++i) {
    if (stream[i] != 0 && stream[i] != 1) throw std::invalid_argument("a stream is 0 (compute) or 1 (comm)");
    tasks[i] = Task{sm_util[i], mem_util[i], bandwidth_share[i], gbps[i]};
    streams[stream[i]].push_back(int(i));
    for (int d : deps_of[i])
      if (d < 0 || size_t(d) >= n) throw std::invalid_argument("a dependency names no task of the schedule");
  }
  for (auto& s : streams)  // stable, as Python's sorted: equal orders keep list order
    std::stable_sort(s.begin(), s.end(), [&](int a, int b) { return order[size_t(a)] < order[size_t(b)]; });
  const double sync = p.cross_stream_sync_us;
  std::vector<std::vector<std::pair<int, double>>> deps(n);
  for (size_t i = 0; i < n; ++i)
    for (int d : deps_of[i]) deps[i].emplace_back(d, stream[size_t(d)] != stream[i] ? sync : 0.0);
  std::vector<double> compute_rates(n, 1.0), comm_rates(n, 1.0), wait_kept(n, 0.0);
  const double comm_wait = p.comm_wait_beside_compute_us;
  const bool latency_bound = p.latency_bound_comm;
  for (size_t i = 0; i < n; ++i) {
    if (stream[i] == 0) {
      compute_rates[i] = compute_rate(tasks[i], p, 1.0);
      comm_rates[i] = comm_rate(tasks[i], p, 1.0);
    }
    wait_kept[i] = latency_bound ? (1.0 - tasks[i].bandwidth_share) * comm_wait : 0.0;
  }
  size_t pos[2] = {0, 0};
  int running[2] = {-1, -1};
  std::vector<double> remaining(n, 0.0), wait(n, 0.0), start(n, 0.0), finish(n, 0.0), release(n, 0.0);
  std::vector<char> ended(n, 0), released_yet(n, 0);
  std::vector<int> started, finished;
  started.reserve(n);
  finished.reserve(n);
  double now = 0.0;

  // When task i may start, or false while a dependency is still running.
  auto released = [&](int i, double& at) -> bool {
    if (released_yet[size_t(i)]) {
      at = release[size_t(i)];
      return true;
    }
    double latest = 0.0;
    bool first = true;
    for (const auto& [d, delay] : deps[size_t(i)]) {
      if (!ended[size_t(d)]) return false;
      double end = finish[size_t(d)] + delay;
      if (first || end > latest) latest = end;  // Python's max: the first of equal values
      first = false;
    }
    release[size_t(i)] = latest;
    released_yet[size_t(i)] = 1;
    at = latest;
    return true;
  };

  std::vector<double> waiting;
  while (finished.size() < n) {
    waiting.clear();
    for (int r = 0; r < 2; ++r) {
      if (running[r] < 0 && pos[r] < streams[r].size()) {
        int nxt = streams[r][pos[r]];
        double at;
        if (released(nxt, at)) {
          if (at <= now + 1e-12 * std::max(1.0, now)) {
            running[r] = nxt;
            start[size_t(nxt)] = now;
            started.push_back(nxt);
            remaining[size_t(nxt)] = duration[size_t(nxt)];
            if (r == 1 && duration[size_t(nxt)] > 0) wait[size_t(nxt)] = comm_wait;
            pos[r] += 1;
          } else {
            waiting.push_back(at);
          }
        }
      }
    }
    const int comp = running[0], comm = running[1];
    if (comp < 0 && comm < 0) {
      if (!waiting.empty()) {
        now = *std::min_element(waiting.begin(), waiting.end());
        continue;
      }
      std::vector<int> stuck;
      for (int r = 0; r < 2; ++r)
        if (pos[r] < streams[r].size()) stuck.push_back(streams[r][pos[r]]);
      return {start, finish, started, finished, stuck};
    }
    double rate_compute = 1.0, rate_comm = 1.0;
    int stalled = -1;
    if (comp >= 0 && comm >= 0) {
      if (wait[size_t(comm)] > 0.0) {
        stalled = comm;
        rate_comm = 0.0;
      } else if (latency_bound) {
        double share = tasks[size_t(comm)].bandwidth_share;
        rate_compute = compute_rate(tasks[size_t(comp)], p, share);
        rate_comm = comm_rate(tasks[size_t(comp)], p, share);
        rate_comm = capped(rate_comm, tasks[size_t(comm)], p);
      } else {
        rate_compute = compute_rates[size_t(comp)];
        rate_comm = capped(comm_rates[size_t(comp)], tasks[size_t(comm)], p);
      }
    } else if (comm >= 0) {
      wait[size_t(comm)] = std::min(wait[size_t(comm)], wait_kept[size_t(comm)]);
    }
    double dt;
    if (comp >= 0) {
      dt = remaining[size_t(comp)] / rate_compute;
      if (comm >= 0 && rate_comm > 0) dt = std::min(dt, remaining[size_t(comm)] / rate_comm);
    } else {
      dt = remaining[size_t(comm)] / rate_comm;
    }
    if (stalled >= 0) dt = std::min(dt, wait[size_t(stalled)]);
    if (!waiting.empty()) dt = std::min(dt, *std::min_element(waiting.begin(), waiting.end()) - now);
    now += dt;
    if (stalled >= 0) {
      wait[size_t(stalled)] = std::max(0.0, wait[size_t(stalled)] - dt);
      if (wait[size_t(stalled)] <= 1e-9 * std::max(1.0, comm_wait)) wait[size_t(stalled)] = 0.0;
    }
    const int which[2] = {comp, comm};
    const double rates[2] = {rate_compute, rate_comm};
    for (int r = 0; r < 2; ++r) {
      int i = which[r];
      if (i < 0 || rates[r] == 0.0) continue;
      remaining[size_t(i)] -= dt * rates[r];
      if (remaining[size_t(i)] <= 1e-9 * std::max(1.0, duration[size_t(i)])) {
        finish[size_t(i)] = now;
        ended[size_t(i)] = 1;
        finished.push_back(i);
        running[r] = -1;
      }
    }
  }
  return {start, finish, started, finished, {}};
}

}  // namespace

PYBIND11_MODULE(_retime, m) {
  m.doc() = "Tessera's contention model: a pair schedule re-timed event by event (contention.retime)";
  m.def(
      "retime",
      [](const std::vector<double>& duration, const std::vector<int>& stream, const std::vector<long long>& order,
         const std::vector<std::vector<int>>& deps, const std::vector<double>& sm_util,
         const std::vector<double>& mem_util, const std::vector<double>& bandwidth_share,
         const std::vector<double>& gbps, double sm_share_lost, double comm_hbm_share,
         double comm_slowdown_per_compute, double comm_slowdown_per_memory, double cross_stream_sync_us,
         double comm_wait_beside_compute_us, bool latency_bound_comm, double comm_latency_slowdown_per_compute,
         double comm_gbps_beside_compute) {
        Params p{sm_share_lost,        comm_hbm_share,
                 comm_slowdown_per_compute, comm_slowdown_per_memory,
                 cross_stream_sync_us, comm_wait_beside_compute_us,
                 comm_latency_slowdown_per_compute, latency_bound_comm,
                 comm_gbps_beside_compute};
        return retime(duration, stream, order, deps, sm_util, mem_util, bandwidth_share, gbps, p);
      },
      "(start, finish, started, finished, stuck) of a schedule under the contention model; stuck names the "
      "stream heads when the stream order deadlocks");
}
