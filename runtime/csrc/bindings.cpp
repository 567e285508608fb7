// The Python face of the C++ runtime: runtime._core, re-exported by runtime/__init__.py
// (runtime/_core.pyi lists what is here). Refusals become runtime.errors.PlanError,
// misuse of an FSM (completing an action twice, ...) becomes ValueError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sstream>

#include "fsm.h"

namespace py = pybind11;
using namespace tessera;

namespace {

std::string action_repr(const Action& a) {
  static const char* kinds[] = {"RUN", "SEND", "RECV", "COLLECTIVE", "WAIT", "DONE"};
  std::ostringstream out;
  out << "Action(" << kinds[int(a.kind)];
  if (a.id >= 0) out << " id=" << a.id;
  if (a.task >= 0) out << " task=" << a.task;
  if (a.mb >= 0) out << " mb=" << a.mb;
  if (a.peer >= 0) out << " peer=" << a.peer;
  if (a.vstage >= 0) out << " vstage=" << a.vstage;
  if (a.wait_for >= 0) out << " wait_for=" << a.wait_for;
  if (a.filled) out << " filled";
  if (a.fallback) out << " fallback";
  out << ")";
  return out.str();
}

std::shared_ptr<Program> load(py::buffer data, int64_t rank, std::optional<py::bytes> signature) {
  py::buffer_info info = data.request();
  if (info.ndim != 1 || info.itemsize != 1) throw std::invalid_argument("plan bytes must be a flat byte buffer");
  std::string expected = signature ? std::string(*signature) : std::string();
  if (signature && expected.size() != kSignatureBytes)
    throw std::invalid_argument("a plan signature is " + std::to_string(kSignatureBytes) + " bytes");
  const auto* bytes = static_cast<const uint8_t*>(info.ptr);
  size_t n = size_t(info.size);
  py::gil_scoped_release release;  // loading a large plan takes milliseconds; let other threads run
  return std::const_pointer_cast<Program>(load_program(bytes, n, rank, expected));
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Tessera's C++ plan loader and per-rank finite-state machine";
  m.attr("FORMAT_VERSION") = kFormatVersion;

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const PlanError& e) {
      py::object cls = py::module_::import("runtime.errors").attr("PlanError");
      py::object err = cls(e.what(), e.reason);
      PyErr_SetObject(cls.ptr(), err.ptr());
    }
  });

  py::class_<PlanInfo>(m, "PlanInfo")
      .def_readonly("pp", &PlanInfo::pp)
      .def_readonly("vpp", &PlanInfo::vpp)
      .def_readonly("ep", &PlanInfo::ep)
      .def_readonly("tp", &PlanInfo::tp)
      .def_readonly("microbatches", &PlanInfo::microbatches)
      .def_readonly("micro_batch_size", &PlanInfo::micro_batch_size)
      .def_readonly("seq_len", &PlanInfo::seq_len)
      .def_readonly("dtype", &PlanInfo::dtype)
      .def_readonly("model", &PlanInfo::model)
      .def_readonly("cost_source", &PlanInfo::cost_source)
      .def_readonly("hardware", &PlanInfo::hardware)
      .def_readonly("memory_budget_bytes", &PlanInfo::memory_budget_bytes)
      .def_property_readonly("virtual_stages", &PlanInfo::virtual_stages);

  py::class_<TaskInfo>(m, "TaskInfo")
      .def_readonly("name", &TaskInfo::name)
      .def_readonly("kind", &TaskInfo::kind)
      .def_readonly("layer", &TaskInfo::layer)
      .def_property_readonly("resource", [](const TaskInfo& t) { return int(t.resource); })
      .def_readonly("movable", &TaskInfo::movable)
      .def_readonly("duration_us", &TaskInfo::duration_us)
      .def_readonly("memory_bytes", &TaskInfo::memory_bytes);

  py::class_<SlotInfo>(m, "SlotInfo")
      .def_readonly("collective_task", &SlotInfo::collective_task)
      .def_readonly("base_us", &SlotInfo::base_us)
      .def_readonly("a2a_us", &SlotInfo::a2a_us)
      .def_readonly("gemm_us", &SlotInfo::gemm_us);

  py::class_<Instr>(m, "Instr")
      .def_property_readonly("op", [](const Instr& i) { return int(i.op); })
      .def_property_readonly("stream", [](const Instr& i) { return int(i.stream); })
      .def_readonly("aux", &Instr::aux)
      .def_readonly("mb", &Instr::mb)
      .def_readonly("a", &Instr::a)
      .def_readonly("b", &Instr::b);

  py::class_<Program, std::shared_ptr<Program>>(m, "Program")
      .def_property_readonly("rank", [](const Program& p) { return p.rank; })
      .def_property_readonly("signature", [](const Program& p) { return py::bytes(p.signature); })
      .def_property_readonly("format_version", [](const Program& p) { return p.format_version; })
      .def_property_readonly("plan", [](const Program& p) { return p.plan; })
      .def_property_readonly("tasks", [](const Program& p) { return p.tasks; })
      .def_property_readonly("slots", [](const Program& p) -> std::optional<std::vector<SlotInfo>> {
        if (!p.has_dbo) return std::nullopt;
        return p.slots;
      })
      .def_property_readonly("instructions", [](const Program& p) { return p.code; })
      .def("task_index",
           [](const Program& p, const std::string& name) -> int64_t {
             for (size_t i = 0; i < p.tasks.size(); ++i)
               if (p.tasks[i].name == name) return int64_t(i);
             throw py::key_error("no task named '" + name + "' in the plan");
           })
      .def("__len__", [](const Program& p) { return p.code.size(); });

  m.def("load_program", &load, py::arg("data"), py::arg("rank"), py::arg("signature") = py::none(),
        "Check plan bytes and return one rank's program; raises runtime.PlanError naming the problem.");

  py::class_<Action>(m, "Action")
      .def_property_readonly("kind", [](const Action& a) { return int(a.kind); })
      .def_readonly("id", &Action::id)
      .def_readonly("stream", &Action::stream)
      .def_readonly("task", &Action::task)
      .def_readonly("mb", &Action::mb)
      .def_readonly("peer", &Action::peer)
      .def_readonly("vstage", &Action::vstage)
      .def_readonly("payload", &Action::payload)
      .def_readonly("collective", &Action::collective)
      .def_readonly("group", &Action::group)
      .def_readonly("filled", &Action::filled)
      .def_readonly("fallback", &Action::fallback)
      .def_readonly("wait_for", &Action::wait_for)
      .def("__repr__", &action_repr);

  py::class_<FSM>(m, "FSM")
      .def(py::init([](std::shared_ptr<Program> program, bool dbo, std::optional<uint64_t> memory_budget_bytes,
                       double min_slot_us, uint32_t max_registered) {
             return std::make_unique<FSM>(std::move(program), dbo, memory_budget_bytes, min_slot_us, max_registered);
           }),
           py::arg("program"), py::kw_only(), py::arg("dbo") = true, py::arg("memory_budget_bytes") = py::none(),
           py::arg("min_slot_us") = 0.0, py::arg("max_registered") = 4096)
      .def("advance", &FSM::advance)
      .def("complete", &FSM::complete, py::arg("action_id"))
      .def("report_tokens", &FSM::report_tokens, py::arg("task"), py::arg("mb"), py::arg("expert_tokens"))
      .def("register_task", &FSM::register_task, py::arg("task"), py::arg("mb"), py::arg("deadline"),
           py::arg("memory_bytes") = py::none())
      .def_property_readonly("pc", &FSM::pc)
      .def_property_readonly("counters", [](const FSM& f) {
        const Counters& c = f.counters();
        py::dict d;
        d["tasks_run"] = c.tasks_run;
        d["offered"] = c.offered;
        d["deferred"] = c.deferred;
        d["refused_memory"] = c.refused_memory;
        d["placed"] = c.placed;
        d["fallbacks"] = c.fallbacks;
        d["slots"] = c.slots;
        d["slots_filled"] = c.slots_filled;
        d["predicted_us"] = c.predicted_us;
        d["observed_us"] = c.observed_us;
        d["abs_error_us"] = c.abs_error_us;
        d["placed_us"] = c.placed_us;
        d["recovered_us"] = c.recovered_us;
        d["overrun_us"] = c.overrun_us;
        d["fallback_us"] = c.fallback_us;
        d["peak_pool_bytes"] = c.peak_pool_bytes;
        return d;
      });

  m.def("load_imbalance", &load_imbalance, py::arg("expert_tokens"), py::arg("ep"),
        "Largest per-rank token load over the mean (rank r owns a contiguous block of experts).");
  m.def("native_ns_per_action", &native_ns_per_action, py::arg("program"), py::arg("dbo") = true,
        py::arg("repeats") = 10, "Nanoseconds per advance()+complete() pair, timed inside C++.");
}
