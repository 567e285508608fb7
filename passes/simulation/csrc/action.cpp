// One action's task loop of the whole-iteration simulator in C++: passes.simulation._action,
// driven by passes.simulation.engine. It is the engine's Python loop (simulate with
// python_loop=True) statement for statement: the same operations on doubles in the same order
// (built without fused multiply-add contraction), so both give bitwise-identical iterations;
// tests compare them.
//
// The loop stops before every task the DBO policy must see (a deferrable task, a slot with work
// in the pool); the engine asks the policy in Python and resumes it, so the policy itself stays
// one implementation, the runtime's.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int COMPUTE = 0;
constexpr int FWD = 0;

struct Interval {
  double start, end;
  int code;  // comm intervals: the kind code (-1: not counted); compute intervals: unused
};

// engine.LaneStats.occupy_all on (free, busy, idle); AssertionError like the Python check.
void occupy_all(const std::vector<Interval>& intervals, double& free, double& busy, double& idle) {
  for (const Interval& iv : intervals) {
    const double start = iv.start, end = iv.end;
    if (start < free - 1e-6 * (start > 1.0 ? start : 1.0)) {
      std::string message = "lane overlap: interval starts at " + py::repr(py::float_(start)).cast<std::string>() +
                            " before the lane is free at " + py::repr(py::float_(free)).cast<std::string>();
      PyErr_SetString(PyExc_AssertionError, message.c_str());
      throw py::error_already_set();
    }
    if (start > free) idle += start - free;
    busy += end - start;
    if (end > free) free = end;
  }
}

// engine._overlap_sweep: per comm kind code, the comm time no compute interval covers.
std::pair<double, double> overlap_sweep(const std::vector<Interval>& comm, const std::vector<Interval>& compute) {
  double exposed[2] = {0.0, 0.0};
  size_t j = 0;
  const size_t n = compute.size();
  for (const Interval& c : comm) {
    const double cs = c.start, ce = c.end;
    double covered = 0.0;
    while (j < n && compute[j].end <= cs) ++j;
    size_t k = j;
    while (k < n && compute[k].start < ce) {
      const double lo = compute[k].start > cs ? compute[k].start : cs;
      const double hi = compute[k].end < ce ? compute[k].end : ce;
      if (hi > lo) covered += hi - lo;
      ++k;
    }
    if (c.code >= 0) exposed[c.code] += (ce - cs) - covered;
  }
  return {exposed[0], exposed[1]};
}

class ActionLoop {
 public:
  ActionLoop(std::vector<int> stream, std::vector<double> fixed, std::vector<double> var,
             std::vector<std::vector<int>> deps, std::vector<int> routed, std::vector<int> code, std::vector<int> side,
             std::vector<bool> deferrable, std::vector<bool> slot, int routed_layers)
      : stream_(std::move(stream)), fixed_(std::move(fixed)), var_(std::move(var)), deps_(std::move(deps)),
        routed_(std::move(routed)), code_(std::move(code)), side_(std::move(side)), deferrable_(std::move(deferrable)),
        slot_(std::move(slot)), routed_layers_(routed_layers) {
    const size_t n = stream_.size();
    if (fixed_.size() != n || var_.size() != n || deps_.size() != n || routed_.size() != n || code_.size() != n ||
        side_.size() != n || deferrable_.size() != n || slot_.size() != n)
      throw std::invalid_argument("every per-task list must have one entry per task");
    for (size_t i = 0; i < n; ++i) {
      if (stream_[i] != 0 && stream_[i] != 1) throw std::invalid_argument("a stream is 0 (compute) or 1 (comm)");
      if (routed_[i] < -1 || routed_[i] >= routed_layers_) throw std::invalid_argument("a routed index names no routed layer");
      if (code_[i] < -1 || code_[i] > 1) throw std::invalid_argument("a kind code is -1, 0 (dispatch) or 1 (combine)");
      for (int d : deps_[i])
        if (d < 0 || size_t(d) >= i) throw std::invalid_argument("a task depends on a task listed at or after it");
    }
    fin_.assign(n, 0.0);
  }

  // A fresh run of the action: its start, the streams' free times, its routed layers' factors.
  void start(double t0, double free_c, double free_m, std::vector<double> factors) {
    if (factors.size() != size_t(routed_layers_)) throw std::invalid_argument("one factor per routed layer");
    factors_ = std::move(factors);
    t0_ = t0;
    free_c_ = t0 > free_c ? t0 : free_c;  // Python's max(compute_lane.free_us, t0): the first unless the second is larger
    free_m_ = t0 > free_m ? t0 : free_m;
    fwd_end_ = bwd_end_ = t0;
    pos_ = 0;
    compute_.clear();
    comm_.clear();
    started_ = true;
    stopped_ = false;
  }

  // Run tasks until one the policy must see (with ``policy``: a deferrable task, or a slot task
  // that would wait while ``pool_has_work``); (its index, ready time, duration, compute free
  // time), or index -1 when the action's tasks are done.
  std::tuple<int, double, double, double> advance(bool policy, bool pool_has_work) {
    if (!started_ || stopped_) throw std::logic_error("advance() needs a started action that is not stopped at a task");
    for (; pos_ < stream_.size(); ++pos_) {
      const size_t i = pos_;
      const double ready = ready_time(i), dur = duration(i);
      if (policy && stream_[i] == COMPUTE && (deferrable_[i] || (slot_[i] && ready > free_c_ && pool_has_work))) {
        stopped_ = true;
        return {int(i), ready, dur, free_c_};
      }
      run(i, ready, dur);
    }
    return {-1, 0.0, 0.0, free_c_};
  }

  // The task advance() stopped at was taken by the pool: it finishes, for its dependents (none),
  // when it was ready.
  void defer() {
    check_stopped();
    fin_[pos_] = ready_time(pos_);
    ++pos_;
    stopped_ = false;
  }

  // The task advance() stopped at runs, after the pooled tasks ``fills`` placed before it.
  void run_stopped(const std::vector<double>& fills) {
    check_stopped();
    for (double d : fills) {
      compute_.push_back({free_c_, free_c_ + d, -1});
      free_c_ += d;
    }
    run(pos_, ready_time(pos_), duration(pos_));
    ++pos_;
    stopped_ = false;
  }

  // The end of the action: the deadline fallbacks ``due`` on the compute stream, the lanes'
  // (free, busy, idle) and the dispatch/combine totals carried on; returns those, the streams'
  // free times, the sides' ends and the action's exposed dispatch and combine.
  py::tuple finish(const std::vector<double>& due, double c_free, double c_busy, double c_idle, double m_free,
                   double m_busy, double m_idle, double total_dispatch, double total_combine) {
    if (!started_ || stopped_ || pos_ != stream_.size()) throw std::logic_error("finish() needs every task run");
    for (double d : due) {
      compute_.push_back({free_c_, free_c_ + d, -1});
      free_c_ += d;
    }
    occupy_all(compute_, c_free, c_busy, c_idle);
    occupy_all(comm_, m_free, m_busy, m_idle);
    double totals[2] = {total_dispatch, total_combine};
    for (const Interval& iv : comm_)
      if (iv.code >= 0) totals[iv.code] += iv.end - iv.start;
    const auto exposed = overlap_sweep(comm_, compute_);
    started_ = false;
    return py::make_tuple(free_c_, free_m_, fwd_end_, bwd_end_, c_free, c_busy, c_idle, m_free, m_busy, m_idle,
                          totals[0], totals[1], exposed.first, exposed.second);
  }

 private:
  double ready_time(size_t i) const {
    double ready = t0_;
    for (int d : deps_[i])
      if (fin_[size_t(d)] > ready) ready = fin_[size_t(d)];
    return ready;
  }

  double duration(size_t i) const {
    return routed_[i] >= 0 ? fixed_[i] + var_[i] * factors_[size_t(routed_[i])] : fixed_[i] + var_[i];
  }

  void run(size_t i, double ready, double dur) {
    double end;
    if (stream_[i] == COMPUTE) {
      const double start = free_c_ > ready ? free_c_ : ready;
      end = start + dur;
      free_c_ = end;
      compute_.push_back({start, end, -1});
    } else {
      const double start = free_m_ > ready ? free_m_ : ready;
      end = start + dur;
      free_m_ = end;
      comm_.push_back({start, end, code_[i]});
    }
    fin_[i] = end;
    if (side_[i] == FWD) {
      if (end > fwd_end_) fwd_end_ = end;
    } else if (end > bwd_end_) {
      bwd_end_ = end;
    }
  }

  void check_stopped() const {
    if (!stopped_) throw std::logic_error("no task is waiting for the policy");
  }

  std::vector<int> stream_;
  std::vector<double> fixed_, var_;
  std::vector<std::vector<int>> deps_;
  std::vector<int> routed_, code_, side_;
  std::vector<bool> deferrable_, slot_;
  int routed_layers_;
  std::vector<double> fin_, factors_;
  std::vector<Interval> compute_, comm_;
  double t0_ = 0.0, free_c_ = 0.0, free_m_ = 0.0, fwd_end_ = 0.0, bwd_end_ = 0.0;
  size_t pos_ = 0;
  bool started_ = false, stopped_ = false;
};

}  // namespace

PYBIND11_MODULE(_action, m) {
  m.doc() = "One action's task loop of the whole-iteration simulator (passes.simulation.engine).";
  py::class_<ActionLoop>(m, "ActionLoop")
      .def(py::init<std::vector<int>, std::vector<double>, std::vector<double>, std::vector<std::vector<int>>,
                    std::vector<int>, std::vector<int>, std::vector<int>, std::vector<bool>, std::vector<bool>, int>(),
           py::arg("stream"), py::arg("fixed"), py::arg("var"), py::arg("deps"), py::arg("routed"), py::arg("code"),
           py::arg("side"), py::arg("deferrable"), py::arg("slot"), py::arg("routed_layers"))
      .def("start", &ActionLoop::start)
      .def("advance", &ActionLoop::advance)
      .def("defer", &ActionLoop::defer)
      .def("run_stopped", &ActionLoop::run_stopped)
      .def("finish", &ActionLoop::finish);
}
