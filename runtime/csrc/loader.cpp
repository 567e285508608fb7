// The C++ plan loader: every check of runtime/bytecode.py's decode(), in the
// same order and with the same reason codes. Nothing here trusts a count or an
// offset before comparing it with the bytes actually present (all arithmetic
// on untrusted numbers is done in 64 bits), so no input can make it read out of
// bounds, allocate without limit or loop without end.
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "format.h"

namespace tessera {
namespace {

uint16_t rd16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t rd32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
uint64_t rd64(const uint8_t* p) { return uint64_t(rd32(p)) | (uint64_t(rd32(p + 4)) << 32); }
double rdf64(const uint8_t* p) {
  uint64_t bits = rd64(p);
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// `x` as Python's repr() writes it (the shortest digits that read back as x; exponent form when
// the decimal point falls more than 16 places right or 4 left of the first digit), so that a
// refusal quoting a number reads the same from both loaders.
std::string python_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // [-]d[.ddd]e[+-]XX
  std::string sign = sci[0] == '-' ? "-" : "";
  if (!sign.empty()) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int decpt = std::atoi(sci.c_str() + e + 1) + 1;  // x = 0.digits * 10^decpt
  const int n = int(digits.size());
  if (decpt <= -4 || decpt > 16) {
    std::string out = sign + digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    const int exponent = decpt - 1;
    const std::string magnitude = std::to_string(std::abs(exponent));
    return out + (exponent < 0 ? "e-" : "e+") + (magnitude.size() < 2 ? "0" : "") + magnitude;
  }
  if (decpt <= 0) return sign + "0." + std::string(size_t(-decpt), '0') + digits;
  if (decpt >= n) return sign + digits + std::string(size_t(decpt - n), '0') + ".0";
  return sign + digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
}

[[noreturn]] void fail(const char* reason, const std::string& message) { throw PlanError(reason, message); }

const char* section_name(uint16_t kind) {
  switch (kind) {
    case 1: return "PLAN";
    case 2: return "STRINGS";
    case 3: return "TASKS";
    case 4: return "SLOTS";
    case 5: return "PROGRAM";
    default: return "?";
  }
}

const char* op_name(uint8_t op) {
  static const char* names[] = {"END", "RUN", "SEND", "RECV", "COLLECTIVE", "WAIT", "SLOT", "DEFER"};
  return op < kOpCount ? names[op] : nullptr;
}

// Strict UTF-8, as Python's decoder: no overlong forms, no surrogates, nothing past U+10FFFF.
bool valid_utf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

struct Section {
  uint16_t kind;
  uint32_t id;
  uint64_t offset, size;
};

bool finite_nonnegative(double x) { return std::isfinite(x) && x >= 0; }

const std::string& string_ref(const std::vector<std::string>& strings, uint32_t ref, const std::string& what) {
  if (ref >= strings.size()) fail("string", cat(what, " refers to string ", ref, ", but there are ", strings.size()));
  return strings[ref];
}

// (count, offset of the first record) of a counted record section, checking its size.
std::pair<uint64_t, uint64_t> records(const uint8_t* d, const Section& s, size_t record, const char* what) {
  if (s.size < 4) fail("section-size", cat("the ", what, " section is ", s.size, " bytes, too small for its record count"));
  uint64_t count = rd32(d + s.offset);
  if (4 + count * record != s.size)
    fail("section-size", cat("the ", what, " section announces ", count, " records (", 4 + count * record,
                             " bytes) but is ", s.size, " bytes"));
  return {count, s.offset + 4};
}

std::vector<std::string> decode_strings(const uint8_t* d, const Section& s) {
  if (s.size < 4) fail("section-size", cat("the STRINGS section is ", s.size, " bytes, too small for its count"));
  uint64_t count = rd32(d + s.offset);
  uint64_t table = 4 + count * 8;
  if (table > s.size)
    fail("section-size", cat("the STRINGS section announces ", count, " strings, more than its ", s.size, " bytes hold"));
  uint64_t blob_start = s.offset + table, blob_size = s.size - table;
  std::vector<std::string> out;
  out.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t off = rd32(d + s.offset + 4 + i * 8), len = rd32(d + s.offset + 8 + i * 8);
    if (off + len > blob_size)
      fail("string", cat("string ", i, " (offset ", off, ", length ", len, ") runs past the string bytes"));
    const uint8_t* p = d + blob_start + off;
    if (!valid_utf8(p, len)) fail("string", cat("string ", i, " is not valid UTF-8"));
    out.emplace_back(reinterpret_cast<const char*>(p), len);
  }
  return out;
}

PlanInfo decode_plan(const uint8_t* d, const Section& s, const std::vector<std::string>& strings) {
  if (s.size != kPlanRecordBytes)
    fail("section-size", cat("the PLAN section is ", s.size, " bytes; it must be ", kPlanRecordBytes));
  const uint8_t* p = d + s.offset;
  uint32_t v[12];
  for (int i = 0; i < 12; ++i) v[i] = rd32(p + 4 * i);
  static const char* names[] = {"pp", "vpp", "ep", "tp", "microbatches", "micro_batch_size", "seq_len"};
  for (int i = 0; i < 7; ++i)
    if (v[i] < 1) fail("plan", cat("the plan's ", names[i], " is ", v[i], "; it must be at least 1"));
  if (v[11] != 0) fail("plan", "the PLAN section's reserved field is not zero");
  PlanInfo info;
  info.pp = v[0]; info.vpp = v[1]; info.ep = v[2]; info.tp = v[3];
  info.microbatches = v[4]; info.micro_batch_size = v[5]; info.seq_len = v[6];
  info.dtype = string_ref(strings, v[7], "the plan's dtype");
  info.model = string_ref(strings, v[8], "the plan's model");
  info.cost_source = string_ref(strings, v[9], "the plan's cost source");
  info.hardware = string_ref(strings, v[10], "the plan's hardware");
  info.memory_budget_bytes = rd64(p + 48);
  return info;
}

std::vector<TaskInfo> decode_tasks(const uint8_t* d, const Section& s, const std::vector<std::string>& strings) {
  auto [count, start] = records(d, s, kTaskRecordBytes, "TASKS");
  std::vector<TaskInfo> tasks;
  tasks.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* p = d + start + i * kTaskRecordBytes;
    std::string what = cat("task ", i);
    TaskInfo t;
    t.name = string_ref(strings, rd32(p), what + "'s name");
    t.kind = string_ref(strings, rd32(p + 4), what + "'s kind");
    t.layer = string_ref(strings, rd32(p + 8), what + "'s layer");
    uint8_t resource = p[12], flags = p[13];
    uint16_t reserved = rd16(p + 14);
    t.duration_us = rdf64(p + 16);
    t.memory_bytes = rd64(p + 24);
    if (resource > 1)
      fail("task", cat("task ", i, " ('", t.name, "') has resource ", int(resource), "; it must be 0 (compute) or 1 (comm)"));
    if ((flags & ~kTaskFlagMovable) || reserved)
      fail("task", cat("task ", i, " ('", t.name, "') has unknown flag bits or a non-zero reserved field"));
    if (!finite_nonnegative(t.duration_us))
      fail("task", cat("task ", i, " ('", t.name, "') has duration ", python_float(t.duration_us), "; it must be finite and >= 0"));
    t.movable = flags & kTaskFlagMovable;
    t.resource = Stream(resource);
    if (t.movable && t.resource != Stream::Compute)
      fail("task", cat("task ", i, " ('", t.name, "') is movable but runs on the comm stream"));
    tasks.push_back(std::move(t));
  }
  return tasks;
}

std::vector<SlotInfo> decode_slots(const uint8_t* d, const Section& s, const std::vector<TaskInfo>& tasks) {
  auto [count, start] = records(d, s, kSlotRecordBytes, "SLOTS");
  std::vector<SlotInfo> slots;
  slots.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* p = d + start + i * kSlotRecordBytes;
    uint32_t task = rd32(p), reserved = rd32(p + 4);
    double base_us = rdf64(p + 8), a2a_us = rdf64(p + 16), gemm_us = rdf64(p + 24);
    if (task >= tasks.size() || tasks[task].resource != Stream::Comm)
      fail("slot", cat("slot ", i, " waits on task ", task, ", which is not a comm task of the plan"));
    if (reserved || !finite_nonnegative(base_us) || !finite_nonnegative(a2a_us) || !finite_nonnegative(gemm_us))
      fail("slot", cat("slot ", i, " has a non-zero reserved field or a negative or non-finite time"));
    slots.push_back({task, base_us, a2a_us, gemm_us});
  }
  return slots;
}

bool completing(Op op) {
  return op == Op::Run || op == Op::Send || op == Op::Recv || op == Op::Collective || op == Op::Defer;
}

// A macro rather than a function so that the message is only built when the check fails:
// programs have hundreds of thousands of instructions.
#define need(ok, why) \
  do {                \
    if (!(ok)) bad(why); \
  } while (0)

void check_instructions(Program& prog) {
  const PlanInfo& plan = prog.plan;
  const auto& code = prog.code;
  const size_t last = code.size() - 1;
  const uint32_t rank = prog.rank;
  for (size_t i = 0; i < code.size(); ++i) {
    const uint8_t op = uint8_t(code[i].op);
    const uint8_t stream = uint8_t(code[i].stream);
    const uint32_t aux = code[i].aux, mb = code[i].mb, a = code[i].a, b = code[i].b;
    auto bad = [&](const std::string& why) {
      const char* name = op_name(op);
      fail("instruction", cat("rank ", rank, " instruction ", i, " (", name ? name : std::to_string(op), "): ", why));
    };
    auto mb_ok = [&] { need(mb < plan.microbatches, cat("micro-batch ", mb, " is not below the plan's ", plan.microbatches)); };
    if (op >= kOpCount) bad("unknown opcode");
    if (stream > 1) bad(cat("stream ", int(stream), " is neither 0 (compute) nor 1 (comm)"));
    if ((Op(op) == Op::End) != (i == last)) bad("END must be the last instruction, and the last instruction must be END");
    switch (Op(op)) {
      case Op::End:
        need(stream == 0 && aux == 0 && mb == 0 && a == 0 && b == 0, "END takes no operands");
        break;
      case Op::Run:
        need(stream == 0 && aux == 0 && b == 0, "RUN is on the compute stream with operands (task, mb)");
        need(a < prog.tasks.size(), cat("task ", a, " is not in the task table (", prog.tasks.size(), " tasks)"));
        need(prog.tasks[a].resource == Stream::Compute,
             cat("task '", prog.tasks[a].name, "' is a comm task; comm tasks are COLLECTIVEs"));
        mb_ok();
        break;
      case Op::Send:
      case Op::Recv: {
        need(stream == 1 && aux <= 1, "SEND/RECV are on the comm stream with payload 0 or 1");
        need(a < plan.pp && a != rank, cat("peer ", a, " is not another pipeline rank (0..", plan.pp - 1, ")"));
        need(b < plan.virtual_stages(), cat("virtual stage ", b, " is not below ", plan.virtual_stages()));
        uint32_t owner = Op(op) == Op::Send ? rank : a;
        need(b % plan.pp == owner,
             cat("virtual stage ", b, " does not live on rank ", owner, " (stage s lives on rank s mod pp)"));
        mb_ok();
        break;
      }
      case Op::Collective:
        need(stream == 1, "COLLECTIVE is on the comm stream");
        if (aux == uint16_t(Collective::AllToAll)) {
          need(a < prog.tasks.size() && prog.tasks[a].resource == Stream::Comm, cat("task ", a, " is not a comm task of the plan"));
          need(b == uint32_t(Group::EP), "an All-to-All runs over the EP group (0)");
          mb_ok();
        } else if (aux == uint16_t(Collective::GradReduce)) {
          need(a < plan.virtual_stages() && a % plan.pp == rank, cat("virtual stage ", a, " does not live on rank ", rank));
          need(b == uint32_t(Group::DP) && mb == 0, "a gradient reduction runs over the DP group with micro-batch 0");
        } else {
          bad(cat("unknown collective kind ", aux));
        }
        break;
      case Op::Wait:
        need(aux == 0 && mb == 0 && b == 0, "WAIT takes one operand, the instruction waited on");
        need(a < i, cat("waits on instruction ", a, ", which does not come before it"));
        need(completing(code[a].op), cat("waits on instruction ", a, ", which is not work that completes"));
        need(code[a].op != Op::Defer || code[a].b <= i, cat("waits on DEFER ", a, ", whose deadline comes after the wait"));
        break;
      case Op::Slot:
        need(stream == 0 && aux == 0, "SLOT is on the compute stream");
        need(prog.has_dbo && a < prog.slots.size(), cat("slot ", a, " is not in the SLOTS table"));
        need(b < i && code[b].op == Op::Collective && code[b].aux == uint16_t(Collective::AllToAll),
             cat("instruction ", b, " is not an earlier All-to-All"));
        mb_ok();
        break;
      case Op::Defer:
        need(stream == 0 && aux == 0, "DEFER is on the compute stream");
        need(a < prog.tasks.size() && prog.tasks[a].movable, cat("task ", a, " is not a movable task of the plan"));
        need(i < b && b <= last, cat("deadline ", b, " is not after it and at or before END (", last, ")"));
        mb_ok();
        break;
    }
  }
}

#undef need

std::string hex_prefix(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < 8 && i < bytes.size(); ++i) {
    out += digits[uint8_t(bytes[i]) >> 4];
    out += digits[uint8_t(bytes[i]) & 15];
  }
  return out;
}

}  // namespace

uint32_t crc32_of_plan(const uint8_t* data, size_t n) {
  // CRC-32 (zlib's) eight bytes at a time: table k maps a byte to its CRC after k more zero
  // bytes, so eight lookups replace eight dependent steps. Every load checks the whole plan
  // (13 MB for a 1T model at PP16), and the byte-at-a-time loop was most of the load time.
  using Table = std::array<std::array<uint32_t, 256>, 8>;
  static const Table table = [] {
    Table t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (int k = 1; k < 8; ++k)
      for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  auto feed = [&](const uint8_t* p, size_t len) {
    for (; len >= 8; p += 8, len -= 8) {
      const uint32_t low = crc ^ (uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
      crc = table[7][low & 0xFF] ^ table[6][(low >> 8) & 0xFF] ^ table[5][(low >> 16) & 0xFF] ^ table[4][low >> 24] ^
            table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
    }
    for (; len; ++p, --len) crc = table[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
  };
  // The checksum field itself is read as four zero bytes.
  static const uint8_t zeros[4] = {0, 0, 0, 0};
  size_t head = std::min(n, kChecksumOffset);
  feed(data, head);
  if (n > kChecksumOffset) {
    size_t field = std::min<size_t>(4, n - kChecksumOffset);
    feed(zeros, field);
    if (n > kChecksumOffset + 4) feed(data + kChecksumOffset + 4, n - kChecksumOffset - 4);
  }
  return crc ^ 0xFFFFFFFFu;
}

// How many missing pipeline ranks a refusal names before "and N more" (as runtime/bytecode.py).
constexpr uint64_t kMissingRanksNamed = 8;

std::shared_ptr<const Program> load_program(const uint8_t* d, size_t n, int64_t rank,
                                            const std::string& expected_signature, const std::string& rank_label) {
  if (n < kHeaderBytes) fail("truncated", cat("truncated: ", n, " bytes, shorter than the ", kHeaderBytes, "-byte header"));
  if (std::memcmp(d, kMagic, sizeof kMagic) != 0)
    fail("bad-magic", "not a Tessera plan: the file does not start with the .tsb magic bytes");
  uint32_t version = rd32(d + 8), flags = rd32(d + 12);
  if (version != kFormatVersion)
    fail("version", cat("format version ", version, " is not known to this runtime, which reads version ", kFormatVersion,
                        "; compile the plan with the Tessera that matches this runtime"));
  uint64_t file_size = rd32(d + 48), section_count = rd32(d + 52);
  if (file_size > n) fail("truncated", cat("truncated: the header announces ", file_size, " bytes but the file has ", n));
  if (file_size < n) fail("trailing-data", cat(n - file_size, " bytes after the ", file_size, " bytes the header announces"));
  if (crc32_of_plan(d, n) != rd32(d + kChecksumOffset))
    fail("checksum", "checksum mismatch: the plan's bytes changed after it was written");
  if (flags & ~kKnownFlags) {
    std::ostringstream hex;
    hex << std::hex << (flags & ~kKnownFlags);
    fail("flags", cat("unknown flag bits 0x", hex.str(), " in the header"));
  }
  uint64_t table_end = kHeaderBytes + kSectionEntryBytes * section_count;
  if (table_end > n) fail("section-table", cat("the section table of ", section_count, " entries runs past the end of the file"));
  std::vector<Section> sections;
  sections.reserve(section_count);
  for (uint64_t i = 0; i < section_count; ++i) {
    const uint8_t* e = d + kHeaderBytes + kSectionEntryBytes * i;
    uint16_t kind = rd16(e), reserved = rd16(e + 2);
    Section s{kind, rd32(e + 4), rd32(e + 8), rd32(e + 12)};
    if (kind < 1 || kind > 5 || reserved != 0)
      fail("section-kind", cat("section ", i, " has unknown kind ", kind, " (or a non-zero reserved field)"));
    if (s.offset % kAlign || s.offset < table_end || s.offset + s.size > n)
      fail("section-bounds", cat("section ", i, " (", section_name(kind), ") at offset ", s.offset, " size ", s.size,
                                 " lies outside the file's ", n, " bytes after its section table, or is not ", kAlign,
                                 "-byte aligned"));
    sections.push_back(s);
  }
  std::vector<Section> by_offset = sections;
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const Section& x, const Section& y) {
    return x.offset != y.offset ? x.offset < y.offset : x.size < y.size;
  });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i - 1].offset + by_offset[i - 1].size > by_offset[i].offset)
      fail("section-bounds", cat("sections ", section_name(by_offset[i - 1].kind), " and ", section_name(by_offset[i].kind),
                                 " overlap"));
  const Section* found[6] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  std::vector<const Section*> programs;  // in table order, like the Python dict
  for (const Section& s : sections) {
    if (SectionKind(s.kind) == SectionKind::Program) {
      for (const Section* p : programs)
        if (p->id == s.id) fail("section-duplicate", cat("two PROGRAM sections for rank ", s.id));
      programs.push_back(&s);
    } else {
      if (found[s.kind]) fail("section-duplicate", cat("two ", section_name(s.kind), " sections"));
      found[s.kind] = &s;
    }
  }
  for (uint16_t kind : {1, 2, 3})
    if (!found[kind]) fail("section-missing", cat("no ", section_name(kind), " section"));
  bool has_dbo = flags & kFlagDbo;
  if (has_dbo && !found[4]) fail("section-missing", "the DBO flag is set but there is no SLOTS section");
  if (!has_dbo && found[4]) fail("flags", "a SLOTS section is present but the DBO flag is not set");

  auto prog = std::make_shared<Program>();
  std::vector<std::string> strings = decode_strings(d, *found[2]);
  prog->plan = decode_plan(d, *found[1], strings);
  prog->tasks = decode_tasks(d, *found[3], strings);
  prog->has_dbo = has_dbo;
  if (has_dbo) prog->slots = decode_slots(d, *found[4], prog->tasks);
  const uint32_t pp = prog->plan.pp;
  for (const Section* p : programs)
    if (p->id >= pp)
      fail("program", cat("a PROGRAM section for rank ", p->id, ", but the plan has pipeline ranks 0..", pp - 1));
  if (programs.size() != pp) {
    // The ids are distinct and below pp, so pp - programs.size() ranks lack one; the message names
    // the first few (a damaged pp can be 2^32 - 1, too many ranks to list).
    const uint64_t absent = uint64_t(pp) - programs.size();
    std::string missing = "[";
    uint64_t named = 0;
    for (uint32_t r = 0; named < std::min<uint64_t>(absent, kMissingRanksNamed); ++r) {
      bool present = std::any_of(programs.begin(), programs.end(), [&](const Section* p) { return p->id == r; });
      if (!present) {
        missing += (named ? ", " : "") + std::to_string(r);
        ++named;
      }
    }
    missing += "]";
    if (absent > named) missing += cat(" and ", absent - named, " more");
    fail("program", cat("no PROGRAM section for pipeline rank(s) ", missing));
  }
  if (rank < 0 || rank >= int64_t(pp))
    fail("rank", cat("rank ", rank_label.empty() ? std::to_string(rank) : rank_label, " has no program: the plan has pipeline ranks 0..", pp - 1));
  const Section* ps = *std::find_if(programs.begin(), programs.end(), [&](const Section* p) { return p->id == rank; });
  prog->rank = uint32_t(rank);
  if (ps->size < kProgramHeadBytes)
    fail("section-size", cat("the PROGRAM section of rank ", rank, " is ", ps->size, " bytes, too small for its head"));
  uint64_t count = rd32(d + ps->offset), reserved = rd32(d + ps->offset + 4);
  if (kProgramHeadBytes + count * kInstructionBytes != ps->size)
    fail("section-size", cat("the PROGRAM section of rank ", rank, " announces ", count, " instructions (",
                             kProgramHeadBytes + count * kInstructionBytes, " bytes) but is ", ps->size, " bytes"));
  if (reserved) fail("program", cat("the PROGRAM section of rank ", rank, " has a non-zero reserved field"));
  if (count == 0) fail("instruction", cat("rank ", rank, "'s program is empty; a program ends with END"));
  prog->code.resize(count);
  const uint8_t* ip = d + ps->offset + kProgramHeadBytes;
  for (uint64_t i = 0; i < count; ++i, ip += kInstructionBytes)
    prog->code[i] = Instr{Op(ip[0]), Stream(ip[1]), rd16(ip + 2), rd32(ip + 4), rd32(ip + 8), rd32(ip + 12)};
  check_instructions(*prog);
  prog->signature.assign(reinterpret_cast<const char*>(d + 16), kSignatureBytes);
  if (!expected_signature.empty() && expected_signature != prog->signature)
    fail("signature", cat("plan signature ", hex_prefix(prog->signature), "... does not match the model being trained (",
                          hex_prefix(expected_signature),
                          "...): the plan was compiled for another model, other parallel settings or another cost source; "
                          "recompile it"));
  return prog;
}

}  // namespace tessera
