// The plan bytecode (.tsb) as the C++ runtime reads it. runtime/bytecode.py is
// the same format in Python and docs/bytecode.md describes it; keep the three
// in step (the differential tests compare both loaders on the same bytes).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessera {

constexpr uint8_t kMagic[8] = {0x89, 'T', 'S', 'B', '\r', '\n', 0x1a, '\n'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kSignatureBytes = 32;
constexpr size_t kHeaderBytes = 64;
constexpr size_t kSectionEntryBytes = 16;
constexpr size_t kPlanRecordBytes = 56;
constexpr size_t kTaskRecordBytes = 32;
constexpr size_t kSlotRecordBytes = 32;
constexpr size_t kProgramHeadBytes = 8;
constexpr size_t kInstructionBytes = 16;
constexpr size_t kChecksumOffset = 56;
constexpr size_t kAlign = 8;
constexpr uint32_t kFlagDbo = 1;
constexpr uint32_t kKnownFlags = kFlagDbo;
constexpr uint8_t kTaskFlagMovable = 1;

enum class SectionKind : uint16_t { Plan = 1, Strings = 2, Tasks = 3, Slots = 4, Program = 5 };
enum class Op : uint8_t { End = 0, Run = 1, Send = 2, Recv = 3, Collective = 4, Wait = 5, Slot = 6, Defer = 7 };
constexpr uint8_t kOpCount = 8;
enum class Stream : uint8_t { Compute = 0, Comm = 1 };
enum class Collective : uint16_t { AllToAll = 0, GradReduce = 1 };
enum class Group : uint32_t { EP = 0, DP = 1 };

// A refusal: `reason` is one of runtime/errors.py's REASONS.
struct PlanError : std::runtime_error {
  std::string reason;
  PlanError(std::string r, const std::string& message) : std::runtime_error(message), reason(std::move(r)) {}
};

struct PlanInfo {
  uint32_t pp, vpp, ep, tp, microbatches, micro_batch_size, seq_len;
  std::string dtype, model, cost_source, hardware;
  uint64_t memory_budget_bytes;
  // 64 bits: pp and vpp are each up to 2^32 - 1, and a wrapped product would accept or refuse
  // SEND/RECV stages differently from runtime/bytecode.py, whose integers do not wrap.
  uint64_t virtual_stages() const { return uint64_t(pp) * vpp; }
};

struct TaskInfo {
  std::string name, kind, layer;
  Stream resource;
  bool movable;
  double duration_us;
  uint64_t memory_bytes;
};

struct SlotInfo {
  uint32_t collective_task;
  double base_us, a2a_us, gemm_us;
};

struct Instr {
  Op op;
  Stream stream;
  uint16_t aux;
  uint32_t mb, a, b;
};

// One rank's program with the plan's shared tables. Immutable once loaded, so
// any number of FSMs (and threads) may share it.
struct Program {
  std::string signature;  // 32 raw bytes
  uint32_t format_version = kFormatVersion;
  uint32_t rank = 0;
  PlanInfo plan{};
  std::vector<TaskInfo> tasks;
  std::vector<SlotInfo> slots;
  bool has_dbo = false;
  std::vector<Instr> code;
};

uint32_t crc32_of_plan(const uint8_t* data, size_t n);

// Checks the bytes and returns `rank`'s program; throws PlanError naming the
// first problem, in the order docs/bytecode.md lists the checks. An empty
// `expected_signature` skips the signature check. `rank_label`, when not empty, is how the
// caller wrote a rank too large for int64 (passed as INT64_MAX or INT64_MIN): the refusal
// quotes it, as the Python loader does.
std::shared_ptr<const Program> load_program(const uint8_t* data, size_t n, int64_t rank,
                                            const std::string& expected_signature,
                                            const std::string& rank_label = std::string());

}  // namespace tessera
