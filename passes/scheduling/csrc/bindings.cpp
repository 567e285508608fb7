// The Python face of the pair-schedule search: passes.scheduling._search
// (passes/scheduling/_search.pyi lists what is here; passes/scheduling/gap_fit.py calls it).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "pair_search.h"

namespace py = pybind11;
using namespace tessera::pair;

namespace {

Dag make_dag(const std::vector<double>& durations, const std::vector<int>& streams,
             const std::vector<std::vector<int>>& deps, const std::vector<int>& sides, const std::vector<bool>& movable,
             const std::vector<std::optional<double>>& deadlines) {
  Dag g;
  g.n = int(durations.size());
  size_t n = durations.size();
  if (streams.size() != n || deps.size() != n || sides.size() != n || movable.size() != n || deadlines.size() != n)
    throw std::invalid_argument("every per-task list must have one entry per task");
  g.dur = durations;
  g.res = streams;
  g.side = sides;
  g.preds = deps;
  g.movable.resize(n);
  g.deadline.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (streams[i] != 0 && streams[i] != 1) throw std::invalid_argument("a stream is 0 (compute) or 1 (comm)");
    g.movable[i] = movable[i] ? 1 : 0;
    g.deadline[i] = movable[i] && deadlines[i] ? *deadlines[i] : kInf;
  }
  g.finish();
  return g;
}

}  // namespace

PYBIND11_MODULE(_search, m) {
  m.doc() = "Tessera's pair-schedule search: constructive schedules, merge search and critical reinsertion";
  m.attr("SOURCE_SHA256") = TESSERA_SEARCH_SOURCE_SHA256;

  m.def(
      "lower_bound",
      [](const std::vector<double>& durations, const std::vector<int>& streams, const std::vector<std::vector<int>>& deps) {
        size_t n = durations.size();
        Dag g = make_dag(durations, streams, deps, std::vector<int>(n, 0), std::vector<bool>(n, false),
                         std::vector<std::optional<double>>(n));
        return lower_bound(g);
      },
      py::arg("durations"), py::arg("streams"), py::arg("deps"),
      "The lower bound of every schedule (busier stream, critical path, Jackson's bound per stream).");

  m.def(
      "search",
      [](const std::vector<double>& durations, const std::vector<int>& streams, const std::vector<std::vector<int>>& deps,
         const std::vector<int>& sides, const std::vector<bool>& movable, const std::vector<std::optional<double>>& deadlines,
         const std::vector<std::vector<double>>& initial, int merge_iterations, int merge_patience, int merge_phases, int rounds,
         int reinsert_rounds, int starts, int merge_span) {
        Dag g = make_dag(durations, streams, deps, sides, movable, deadlines);
        Options opt;
        opt.merge_iterations = merge_iterations;
        opt.merge_patience = merge_patience;
        opt.merge_phases = merge_phases;
        opt.rounds = rounds;
        opt.reinsert_rounds = reinsert_rounds;
        opt.starts = starts;
        opt.merge_span = merge_span;
        Stats stats;
        std::vector<double> start;
        {
          py::gil_scoped_release release;
          start = search(g, initial, opt, stats);
        }
        py::dict info;
        info["rule"] = stats.rule;
        info["evaluations"] = stats.evaluations;
        info["fits"] = stats.fits;
        info["fit_reuses"] = stats.fit_reuses;
        info["reinsert_reuses"] = stats.reinsert_reuses;
        info["justify_reuses"] = stats.justify_reuses;
        info["candidates"] = stats.candidates;
        info["merge_steps"] = stats.merge_steps;
        info["last_gain"] = stats.last_gain;
        info["bound"] = stats.lower_bound;
        return py::make_tuple(start, info);
      },
      py::arg("durations"), py::arg("streams"), py::arg("deps"), py::arg("sides"), py::arg("movable"),
      py::arg("deadlines"), py::arg("initial"), py::arg("merge_iterations"), py::arg("merge_patience"), py::arg("merge_phases"), py::arg("rounds"),
      py::arg("reinsert_rounds"), py::arg("starts"), py::arg("merge_span"),
      "The best schedule found (start times) and what the search did; RuntimeError when no schedule meets the deadlines.");
}
