// The Python face of the C++ runtime: runtime._core, re-exported by runtime/__init__.py
// (runtime/_core.pyi lists what is here). Refusals become runtime.errors.PlanError,
// misuse of an FSM (completing an action twice, ...) becomes ValueError.
//
// FSM.advance() and FSM.complete() are the two calls a trainer makes per action, so they
// bypass pybind11's dispatcher (plain CPython methods on the bound class), and an Action is
// a struct sequence: a tuple whose fields read as attributes through member descriptors,
// several times cheaper to build and to read than a bound C++ object.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <structseq.h>

#include <sstream>

#include "fsm.h"

namespace py = pybind11;
using namespace tessera;

namespace {

PyTypeObject* action_type = nullptr;

PyStructSequence_Field action_fields[] = {
    {"kind", "RUN 0, SEND 1, RECV 2, COLLECTIVE 3, WAIT 4, DONE 5"},
    {"id", "report completion with this id (-1: none)"},
    {"stream", "0 compute, 1 comm"},
    {"task", "index into the plan's task table"},
    {"mb", "micro-batch"},
    {"peer", "SEND/RECV: the other pipeline rank"},
    {"vstage", "SEND/RECV: the virtual stage that produced the tensor; gradient reduction: whose gradients"},
    {"payload", "SEND/RECV: 0 activation, 1 gradient"},
    {"collective", "COLLECTIVE: 0 all-to-all, 1 gradient reduction"},
    {"group", "COLLECTIVE: 0 EP, 1 DP"},
    {"filled", "a movable task placed in a DBO slot"},
    {"fallback", "a movable task run on the main stream because its deadline came"},
    {"wait_for", "WAIT: the action that must complete first"},
    {nullptr, nullptr},
};
PyStructSequence_Desc action_desc = {"runtime._core.Action",
                                     "What the trainer does next; fields that do not apply to the kind are -1 (or False).",
                                     action_fields, 13};

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

int64_t item(PyObject* tuple, Py_ssize_t k) { return PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, k)); }

PyObject* action_tp_repr(PyObject* self) {
  Action a;
  a.kind = ActionKind(item(self, 0));
  a.id = item(self, 1);
  a.task = item(self, 3);
  a.mb = item(self, 4);
  a.peer = int32_t(item(self, 5));
  a.vstage = item(self, 6);
  a.filled = PyTuple_GET_ITEM(self, 10) == Py_True;
  a.fallback = PyTuple_GET_ITEM(self, 11) == Py_True;
  a.wait_for = item(self, 12);
  return PyUnicode_FromString(action_repr(a).c_str());
}

PyObject* make_action(const Action& a) {
  PyObject* t = PyStructSequence_New(action_type);
  if (t == nullptr) return nullptr;
  const int64_t ints[] = {int64_t(a.kind), a.id, a.stream, a.task, a.mb, a.peer, a.vstage, a.payload,
                          a.collective, a.group};
  for (Py_ssize_t k = 0; k < 10; ++k) {
    PyObject* v = PyLong_FromLongLong(ints[k]);
    if (v == nullptr) {
      Py_DECREF(t);
      return nullptr;
    }
    PyStructSequence_SET_ITEM(t, k, v);
  }
  PyStructSequence_SET_ITEM(t, 10, Py_NewRef(a.filled ? Py_True : Py_False));
  PyStructSequence_SET_ITEM(t, 11, Py_NewRef(a.fallback ? Py_True : Py_False));
  PyObject* w = PyLong_FromLongLong(a.wait_for);
  if (w == nullptr) {
    Py_DECREF(t);
    return nullptr;
  }
  PyStructSequence_SET_ITEM(t, 12, w);
  return t;
}

// The C++ FSM behind a bound FSM object; nullptr (with a Python error set) if it was never constructed.
FSM* fsm_of(PyObject* self) {
  auto vh = reinterpret_cast<py::detail::instance*>(self)->get_value_and_holder();
  if (!vh.holder_constructed()) {
    PyErr_SetString(PyExc_TypeError, "FSM.__init__ was not called");
    return nullptr;
  }
  return vh.value_ptr<FSM>();
}

PyObject* fsm_advance(PyObject* self, PyObject*) {
  FSM* fsm = fsm_of(self);
  if (fsm == nullptr) return nullptr;
  try {
    return make_action(fsm->advance());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyObject* fsm_complete(PyObject* self, PyObject* arg) {
  FSM* fsm = fsm_of(self);
  if (fsm == nullptr) return nullptr;
  long long id = PyLong_AsLongLong(arg);
  if (id == -1 && PyErr_Occurred()) return nullptr;
  try {
    fsm->complete(id);
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef fsm_fast_methods[] = {
    {"advance", fsm_advance, METH_NOARGS, "The next action for the trainer (an Action)."},
    {"complete", fsm_complete, METH_O,
     "complete(action_id): the work of action `action_id` finished (any thread)."},
    {nullptr, nullptr, 0, nullptr},
};

std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

// check_rank's twin (runtime/bytecode.py): any integer but a bool, however large. One beyond
// int64 goes to the loader as INT64_MAX or INT64_MIN, which no plan has, with its decimal text
// for the refusal.
int64_t rank_argument(py::handle rank, std::string& label) {
  if (PyBool_Check(rank.ptr()) || !PyIndex_Check(rank.ptr()))
    throw py::type_error("rank must be an integer pipeline rank, got " + type_name(rank));
  auto index = py::reinterpret_steal<py::object>(PyNumber_Index(rank.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  long long value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow == 0) return value;
  label = py::str(index);
  return overflow > 0 ? INT64_MAX : INT64_MIN;
}

// check_signature's twin: None, or bytes-like of kSignatureBytes bytes.
std::string signature_argument(py::handle signature) {
  if (signature.is_none()) return std::string();
  PyObject* s = signature.ptr();
  if (!PyBytes_Check(s) && !PyByteArray_Check(s) && !PyMemoryView_Check(s))
    throw py::type_error("a plan signature is " + std::to_string(kSignatureBytes) + " bytes or None, got " +
                         type_name(signature));
  auto value = py::reinterpret_steal<py::bytes>(PyBytes_FromObject(s));
  if (!value) throw py::error_already_set();
  std::string out = value;
  if (out.size() != kSignatureBytes)
    throw py::value_error("a plan signature is " + std::to_string(kSignatureBytes) + " bytes (a SHA-256 digest), got " +
                          std::to_string(out.size()));
  return out;
}

std::shared_ptr<Program> load(py::buffer data, py::object rank, py::object signature) {
  py::buffer_info info = data.request();
  if (info.ndim != 1 || info.itemsize != 1) throw std::invalid_argument("plan bytes must be a flat byte buffer");
  std::string rank_label;
  const int64_t rank_value = rank_argument(rank, rank_label);
  const std::string expected = signature_argument(signature);
  const auto* bytes = static_cast<const uint8_t*>(info.ptr);
  size_t n = size_t(info.size);
  py::gil_scoped_release release;  // loading a large plan takes milliseconds; let other threads run
  return std::const_pointer_cast<Program>(load_program(bytes, n, rank_value, expected, rank_label));
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

  action_type = PyStructSequence_NewType(&action_desc);
  if (action_type == nullptr) throw py::error_already_set();
  action_type->tp_repr = action_tp_repr;
  PyType_Modified(action_type);
  m.add_object("Action", py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(action_type)));

  py::class_<FSM> fsm_class(m, "FSM");
  fsm_class
      .def(py::init([](std::shared_ptr<Program> program, bool dbo, std::optional<uint64_t> memory_budget_bytes,
                       double min_slot_us, uint32_t max_registered, bool admission) {
             return std::make_unique<FSM>(std::move(program), dbo, memory_budget_bytes, min_slot_us, max_registered,
                                          admission);
           }),
           py::arg("program"), py::kw_only(), py::arg("dbo") = true, py::arg("memory_budget_bytes") = py::none(),
           py::arg("min_slot_us") = 0.0, py::arg("max_registered") = 4096, py::arg("admission") = true)
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
        d["refused_deadline"] = c.refused_deadline;
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

  for (PyMethodDef* def = fsm_fast_methods; def->ml_name != nullptr; ++def) {
    py::object method = py::reinterpret_steal<py::object>(
        PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(fsm_class.ptr()), def));
    if (!method) throw py::error_already_set();
    fsm_class.attr(def->ml_name) = method;
  }

  m.def("load_imbalance", &load_imbalance, py::arg("expert_tokens"), py::arg("ep"),
        "Largest per-rank token load over the mean (rank r owns a contiguous block of experts).");
  m.def(
      "native_ns_per_action",
      [](std::shared_ptr<Program> program, bool dbo, std::optional<uint64_t> memory_budget_bytes, int repeats) {
        NativeTiming t = native_ns_per_action(std::move(program), dbo, memory_budget_bytes, repeats);
        return py::make_tuple(t.wall_ns, t.cpu_ns);
      },
      py::arg("program"), py::arg("dbo") = true, py::arg("memory_budget_bytes") = py::none(), py::arg("repeats") = 10,
      "(wall-clock ns, thread CPU ns) per advance()+complete() pair, the best of `repeats` runs, timed inside C++.");
}
