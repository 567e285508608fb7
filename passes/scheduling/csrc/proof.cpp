// z3 proofs of pair schedules, built through z3's C API: passes.scheduling._proof
// (passes/scheduling/_proof.pyi lists what is here; passes/scheduling/check.py calls it).
//
// The same facts as check.py's SMT-LIB script of a well-formed schedule (every task placed once,
// on its own stream, for its own duration: the cases that script writes out as `true`), handed to
// z3 as terms instead of as text. Parsing the text was two thirds of a proof of make demo's pair
// DAGs (16 kB of SMT-LIB per DAG); building the terms costs a small fraction of that. z3 decides
// the facts either way: this file only states them. A schedule it does not prove goes back to
// the text script, which decides it again and, when it fails, names the broken constraint.
//
// libz3 is opened at run time (dlopen) from the file the z3 Python package loads itself, so the
// build needs neither z3's headers nor a link against a file whose place is known only once z3
// is installed. The few declarations below are z3's stable C ABI (opaque pointers, int enums).
#include <dlfcn.h>
#include <unistd.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using Z3_config = void*;
using Z3_context = void*;
using Z3_ast = void*;
using Z3_sort = void*;
using Z3_solver = void*;
using Z3_error_handler = void (*)(Z3_context, int);

struct Z3Api {
  Z3_config (*mk_config)();
  void (*del_config)(Z3_config);
  Z3_context (*mk_context)(Z3_config);
  void (*del_context)(Z3_context);
  void (*set_error_handler)(Z3_context, Z3_error_handler);
  Z3_sort (*mk_real_sort)(Z3_context);
  Z3_ast (*mk_real_int64)(Z3_context, int64_t, int64_t);
  Z3_ast (*mk_numeral)(Z3_context, const char*, Z3_sort);
  Z3_ast (*mk_add)(Z3_context, unsigned, const Z3_ast[]);
  Z3_ast (*mk_sub)(Z3_context, unsigned, const Z3_ast[]);
  Z3_ast (*mk_unary_minus)(Z3_context, Z3_ast);
  Z3_ast (*mk_le)(Z3_context, Z3_ast, Z3_ast);
  Z3_ast (*mk_and)(Z3_context, unsigned, const Z3_ast[]);
  Z3_ast (*mk_ge)(Z3_context, Z3_ast, Z3_ast);
  Z3_solver (*mk_simple_solver)(Z3_context);
  void (*solver_inc_ref)(Z3_context, Z3_solver);
  void (*solver_dec_ref)(Z3_context, Z3_solver);
  void (*solver_assert)(Z3_context, Z3_solver, Z3_ast);
  void (*solver_push)(Z3_context, Z3_solver);
  void (*solver_pop)(Z3_context, Z3_solver, unsigned);
  int (*solver_check)(Z3_context, Z3_solver);
  const char* (*get_full_version)();
};

Z3Api api;
bool loaded = false;
std::string loaded_version;

template <typename F>
bool bind(void* library, const char* name, F& slot) {
  slot = reinterpret_cast<F>(dlsym(library, name));
  return slot != nullptr;
}

// Opens libz3 at `path` and finds every function used here; the library's version, or an
// empty string (and nothing bound) when the file or a function is missing. Once a library is
// loaded, later calls return its version whatever they name.
std::string load(const std::string& path) {
  if (loaded) return loaded_version;
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (library == nullptr) return "";
  Z3Api found{};
  bool ok = bind(library, "Z3_mk_config", found.mk_config) && bind(library, "Z3_del_config", found.del_config) &&
            bind(library, "Z3_mk_context", found.mk_context) && bind(library, "Z3_del_context", found.del_context) &&
            bind(library, "Z3_set_error_handler", found.set_error_handler) &&
            bind(library, "Z3_mk_real_sort", found.mk_real_sort) &&
            bind(library, "Z3_mk_real_int64", found.mk_real_int64) && bind(library, "Z3_mk_numeral", found.mk_numeral) &&
            bind(library, "Z3_mk_add", found.mk_add) && bind(library, "Z3_mk_sub", found.mk_sub) &&
            bind(library, "Z3_mk_unary_minus", found.mk_unary_minus) && bind(library, "Z3_mk_le", found.mk_le) && bind(library, "Z3_mk_and", found.mk_and) &&
            bind(library, "Z3_mk_ge", found.mk_ge) && bind(library, "Z3_mk_simple_solver", found.mk_simple_solver) &&
            bind(library, "Z3_solver_inc_ref", found.solver_inc_ref) &&
            bind(library, "Z3_solver_dec_ref", found.solver_dec_ref) &&
            bind(library, "Z3_solver_assert", found.solver_assert) &&
            bind(library, "Z3_solver_push", found.solver_push) && bind(library, "Z3_solver_pop", found.solver_pop) &&
            bind(library, "Z3_solver_check", found.solver_check) &&
            bind(library, "Z3_get_full_version", found.get_full_version);
  if (!ok) return "";
  api = found;
  loaded = true;
  loaded_version = api.get_full_version();
  return loaded_version;
}

// z3 calls this instead of aborting on a misuse of its API; the proof then counts as not given.
thread_local bool z3_failed = false;
void on_z3_error(Z3_context, int) { z3_failed = true; }

// The decimal digits of m * 2^k (k >= 0), for a double whose exact value does not fit a
// 64-bit numerator or denominator: little-endian limbs of nine digits each.
std::string decimal_times_pow2(uint64_t m, int k) {
  std::vector<uint32_t> limbs;
  for (; m > 0; m /= 1000000000u) limbs.push_back(uint32_t(m % 1000000000u));
  if (limbs.empty()) limbs.push_back(0);
  for (int i = 0; i < k; ++i) {
    uint32_t carry = 0;
    for (auto& limb : limbs) {
      uint64_t doubled = uint64_t(limb) * 2 + carry;
      limb = uint32_t(doubled % 1000000000u);
      carry = uint32_t(doubled / 1000000000u);
    }
    if (carry) limbs.push_back(carry);
  }
  std::string text = std::to_string(limbs.back());
  for (size_t i = limbs.size() - 1; i-- > 0;) {
    std::string part = std::to_string(limbs[i]);
    text += std::string(9 - part.size(), '0') + part;
  }
  return text;
}

class Terms {
 public:
  explicit Terms(Z3_context ctx) : ctx_(ctx), real_(api.mk_real_sort(ctx)) {}

  // The exact value of a finite double: m * 2^e with an odd integer m, as num/den.
  Z3_ast exact(double v) {
    if (v == 0.0) return api.mk_real_int64(ctx_, 0, 1);
    int e = 0;
    double fraction = std::frexp(v, &e);               // v = fraction * 2^e, 0.5 <= |fraction| < 1
    int64_t m = int64_t(std::ldexp(fraction, 53));     // exact: 53 significant bits
    e -= 53;
    while ((m & 1) == 0) {
      m /= 2;
      ++e;
    }
    uint64_t magnitude = uint64_t(m < 0 ? -m : m);
    if (e < 0 && e >= -62) return api.mk_real_int64(ctx_, m, int64_t(1) << -e);
    if (e >= 0 && e <= 9 && magnitude < (uint64_t(1) << 53)) return api.mk_real_int64(ctx_, m << e, 1);
    std::string sign = m < 0 ? "-" : "";
    std::string text = e < 0 ? sign + std::to_string(magnitude) + "/" + decimal_times_pow2(1, -e)
                             : sign + decimal_times_pow2(magnitude, e);
    return api.mk_numeral(ctx_, text.c_str(), real_);
  }
  Z3_ast add(Z3_ast a, Z3_ast b) {
    Z3_ast args[2] = {a, b};
    return api.mk_add(ctx_, 2, args);
  }
  Z3_ast sub(Z3_ast a, Z3_ast b) {
    Z3_ast args[2] = {a, b};
    return api.mk_sub(ctx_, 2, args);
  }

 private:
  Z3_context ctx_;
  Z3_sort real_;
};

// One schedule's facts, as check.py's proof_script states them for a well-formed schedule.
struct Facts {
  std::vector<double> start, duration;
  std::vector<int> stream;
  std::vector<std::vector<int>> deps;
  std::vector<std::optional<double>> deadline;  // movable tasks with a deadline
  std::vector<std::string> name;                 // ties in a stream's start order break by name, as there
};

bool finite(const Facts& f) {
  for (size_t i = 0; i < f.start.size(); ++i) {
    if (!std::isfinite(f.start[i]) || !std::isfinite(f.duration[i])) return false;
    if (f.deadline[i] && !std::isfinite(*f.deadline[i])) return false;
  }
  return true;
}

// The schedule's tolerance, as tessera_ir.schedule_rules.schedule_tolerance computes it: 1e-6 us,
// or 2^8 units in the last place of the largest magnitude among its starts, durations and
// deadlines when that is larger (a power of two, so its double is exact).
Z3_ast schedule_tolerance(Z3_context ctx, Terms& terms, const Facts& f) {
  double largest = 0.0;
  for (size_t i = 0; i < f.start.size(); ++i) {
    largest = std::max({largest, std::fabs(f.start[i]), std::fabs(f.duration[i])});
    if (f.deadline[i]) largest = std::max(largest, std::fabs(*f.deadline[i]));
  }
  if (largest > 0.0) {
    int exponent = 0;
    std::frexp(largest, &exponent);  // largest = m * 2^exponent, 0.5 <= m < 1
    double scaled = std::ldexp(1.0, exponent - 1 - 52 + 8);
    if (scaled > 1e-6) return terms.exact(scaled);
  }
  return api.mk_real_int64(ctx, 1, 1000000);  // check.TOLERANCE_US
}

// One schedule's facts appended to `out`: non-negative and deadline per task, dependency per
// edge, exclusive between neighbours in start order on each stream. False if the input is malformed.
bool state_facts(Z3_context ctx, Terms& terms, const Facts& f, std::vector<Z3_ast>& out) {
  size_t n = f.start.size();
  if (f.duration.size() != n || f.stream.size() != n || f.deps.size() != n || f.deadline.size() != n ||
      f.name.size() != n || !finite(f))
    return false;
  Z3_ast tol = schedule_tolerance(ctx, terms, f);
  Z3_ast minus_tol = api.mk_unary_minus(ctx, tol);
  std::vector<Z3_ast> s(n), end(n);
  for (size_t i = 0; i < n; ++i) {
    s[i] = terms.exact(f.start[i]);
    end[i] = terms.add(s[i], terms.exact(f.duration[i]));
    out.push_back(api.mk_ge(ctx, s[i], minus_tol));  // non-negative
    if (f.deadline[i]) out.push_back(api.mk_le(ctx, end[i], terms.add(terms.exact(*f.deadline[i]), tol)));
  }
  for (size_t j = 0; j < n; ++j) {
    for (int i : f.deps[j]) {
      if (i < 0 || size_t(i) >= n) return false;
      out.push_back(api.mk_ge(ctx, s[j], terms.sub(end[i], tol)));  // dependency
    }
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (f.stream[a] != f.stream[b]) return f.stream[a] < f.stream[b];
    if (f.start[a] != f.start[b]) return f.start[a] < f.start[b];
    double end_a = f.start[a] + f.duration[a], end_b = f.start[b] + f.duration[b];
    if (end_a != end_b) return end_a < end_b;
    return f.name[a] < f.name[b];
  });
  for (size_t k = 1; k < n; ++k) {
    size_t a = order[k - 1], b = order[k];
    if (f.stream[a] != f.stream[b]) continue;
    out.push_back(api.mk_ge(ctx, s[b], terms.sub(end[a], tol)));  // exclusive
  }
  return true;
}

// The context every proof of this process builds its terms in. Making and deleting one cost
// about a third of proving a batch of sixteen of make demo's schedules, so it is kept; its terms live as long as
// it does, so it is made anew after kRecycleAfter schedules (make demo's proofs, over and over,
// peaked 32 MB above the process's size). A process forked from one that holds it makes its
// own and leaves the inherited one alone: nothing of z3 is shared across a fork.
constexpr size_t kRecycleAfter = 256;
struct Context {
  Z3_context ctx = nullptr;
  Z3_solver solver = nullptr;
  pid_t owner = 0;
  size_t schedules = 0;
};
Context context;

Z3_context fresh_context(size_t schedules) {
  pid_t pid = getpid();
  if (context.ctx != nullptr && context.owner == pid && context.schedules + schedules <= kRecycleAfter) {
    context.schedules += schedules;
    return context.ctx;
  }
  if (context.ctx != nullptr && context.owner == pid) {
    api.solver_dec_ref(context.ctx, context.solver);
    api.del_context(context.ctx);
  }
  Z3_config config = api.mk_config();
  context.ctx = api.mk_context(config);
  api.del_config(config);
  api.set_error_handler(context.ctx, on_z3_error);
  context.solver = api.mk_simple_solver(context.ctx);
  api.solver_inc_ref(context.ctx, context.solver);
  context.owner = pid;
  context.schedules = schedules;
  return context.ctx;
}

// Whether z3 finds the conjunction of every schedule's facts satisfiable: ground facts, so
// exactly when each schedule's facts hold. False also when z3 reports an error. The facts go in
// as one conjunction: asserting each on its own cost the solver twice as much for the same answer.
bool prove(const std::vector<Facts>& schedules) {
  if (!loaded) throw std::runtime_error("libz3 is not loaded: call load(path) first");
  Z3_context ctx = fresh_context(schedules.size());
  z3_failed = false;
  Terms terms(ctx);
  std::vector<Z3_ast> facts;
  for (const Facts& schedule : schedules)
    if (!state_facts(ctx, terms, schedule, facts)) return false;
  if (z3_failed) return false;
  // The context's solver, its assertions scoped to this proof (push ... pop): a solver of its
  // own per proof pays its creation every time, a large share of a proof this small
  // (docs/records/2026-12-04-compile-time.md).
  Z3_solver solver = context.solver;
  api.solver_push(ctx, solver);
  if (!facts.empty()) api.solver_assert(ctx, solver, api.mk_and(ctx, unsigned(facts.size()), facts.data()));
  bool ok = !z3_failed && api.solver_check(ctx, solver) == 1 && !z3_failed;  // Z3_L_TRUE
  api.solver_pop(ctx, solver, 1);
  return ok;
}

}  // namespace

PYBIND11_MODULE(_proof, m) {
  m.doc() = "z3 proofs of pair schedules built through z3's C API (the facts of check.py's proof script)";

  m.def("load", &load, py::arg("path"),
        "Open libz3 at path; its version, or '' when it cannot be opened or lacks a function used here.");
  m.def(
      "prove",
      [](std::vector<std::tuple<std::vector<double>, std::vector<double>, std::vector<int>,
                                std::vector<std::vector<int>>, std::vector<std::optional<double>>,
                                std::vector<std::string>>> schedules) {
        std::vector<Facts> facts;
        facts.reserve(schedules.size());
        for (auto& [start, duration, stream, deps, deadline, name] : schedules)
          facts.push_back(Facts{std::move(start), std::move(duration), std::move(stream), std::move(deps),
                                std::move(deadline), std::move(name)});
        py::gil_scoped_release unlocked;
        return prove(facts);
      },
      py::arg("schedules"),
      "Whether z3 proves every schedule (start, duration, stream, deps, deadline, name per task) valid.");
}
