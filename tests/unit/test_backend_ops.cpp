// The op list (core/backend_ops.def), entry by entry:
//  - each entry's args are its params' names, in order (the wrappers pass a call on by them: a
//    swapped pair of ints would compile and be wrong), and no name is listed twice;
//  - ForwardingBackend passes every op to its inner backend, as that same op;
//  - StepGraph treats each op as its graph column says: a RECORDED, SEED, DLOSS (or its own) op is
//    run eagerly at the first micro-batch, recorded at the second, replayed at the third; a BETWEEN
//    op makes its micro-batch run eagerly, naming the op; a QUERY op reaches the inner backend;
//  - AccountBackend adds one call to the account for every COUNT (and its own) op, none for an
//    UNCOUNTED one.
// A Probe backend, itself made from the list, notes the ops it receives; every op is called with
// value-initialised arguments (null pointers, zero sizes), which no wrapper reads through.
#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/forwarding_backend.h"
#include "backend/op_account_backend.h"
#include "backend/step_graph.h"
#include "core/backend.h"

namespace {

// The list's types (Act, CAct, DropRows, ...) are nlp's.
using namespace nlp;

template <class T>
T none() {
  if constexpr (!std::is_void_v<T>) return T{};
}

class Probe final : public Backend {
 public:
  std::vector<std::string> calls;
  std::string name() const override { return "probe"; }
#define NLP_OP(name, ret, params, args, impl, graph, account, cost) \
  ret name params override {                                        \
    calls.push_back(#name);                                         \
    return none<ret>();                                             \
  }
#include "core/backend_ops.def"
  long count(const std::string& op) const {
    long n = 0;
    for (const std::string& c : calls) n += c == op;
    return n;
  }
};

// Calls the op m on b with every argument value-initialised.
template <class R, class... A>
void call_with_defaults(Backend& b, R (Backend::*m)(A...)) {
  (b.*m)(std::decay_t<A>{}...);
}

struct OpCase {
  const char *name, *params, *args, *graph, *account;
  void (*call)(Backend&);
};
const OpCase kOps[] = {
#define NLP_OP(name, ret, params, args, impl, graph, account, cost) \
  {#name, #params, #args, #graph, #account, [](Backend& b) { call_with_defaults(b, &Backend::name); }},
#include "core/backend_ops.def"
};

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// "(a, b)" -> {"a", "b"}: split at the commas outside parentheses and angle brackets.
std::vector<std::string> split_list(std::string s) {
  s = trim(s);
  EXPECT_TRUE(s.size() >= 2 && s.front() == '(' && s.back() == ')') << s;
  s = s.substr(1, s.size() - 2);
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char ch : s) {
    if (ch == '(' || ch == '<' || ch == '{') ++depth;
    if (ch == ')' || ch == '>' || ch == '}') --depth;
    if (ch == ',' && depth == 0) {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!trim(cur).empty()) out.push_back(trim(cur));
  return out;
}

// "const int32_t* pos_ids NLP_ARG_DEFAULT(nullptr)" -> "pos_ids": the last identifier before the default.
std::string param_name(std::string p) {
  if (const size_t d = p.find("NLP_ARG_DEFAULT"); d != std::string::npos) p = p.substr(0, d);
  p = trim(p);
  size_t a = p.size();
  while (a > 0 && (std::isalnum(static_cast<unsigned char>(p[a - 1])) || p[a - 1] == '_')) --a;
  return p.substr(a);
}

std::vector<std::string> param_names(const std::string& params) {
  std::vector<std::string> names;
  for (const std::string& p : split_list(params)) names.push_back(param_name(p));
  return names;
}

TEST(BackendOps, ArgsNameTheParamsInOrder) {
  std::set<std::string> names;
  for (const OpCase& op : kOps) {
    EXPECT_TRUE(names.insert(op.name).second) << op.name << " is listed twice";
    EXPECT_EQ(split_list(op.args), param_names(op.params)) << op.name << ": params " << op.params;
  }
  EXPECT_TRUE(names.count("tanh_forward") && names.count("lm_head_crossentropy") && names.count("zero"));
  // the check itself: a swapped pair, a default argument, a template parameter type
  EXPECT_NE(split_list("(K, M)"), param_names("(int M, int K)"));
  EXPECT_EQ(split_list("(spans, idx)"),
            param_names("(const std::vector<AdamWSpan>& spans, const int32_t* idx NLP_ARG_DEFAULT(nullptr))"));
}

TEST(BackendOps, ForwardingBackendPassesEveryOpOnAsItself) {
  for (const OpCase& op : kOps) {
    Probe probe;
    ForwardingBackend fwd(probe);
    op.call(fwd);
    EXPECT_EQ(probe.calls, std::vector<std::string>{op.name}) << op.name;
  }
}

TEST(BackendOps, StepGraphTreatsEachOpAsItsGraphColumnSays) {
  using How = StepGraph::How;
  for (const OpCase& op : kOps) {
    const std::string graph = op.graph;
    Probe probe;
    StepGraph sg(probe, /*emulate=*/true);
    auto body = [&] { op.call(sg); };
    if (graph == "RECORDED" || graph == "SEED" || graph == "DLOSS" || graph == "OWN") {
      EXPECT_EQ(sg.run(body), How::Eager) << op.name;
      EXPECT_EQ(sg.run(body), How::Recorded) << op.name;
      EXPECT_EQ(sg.run(body), How::Replayed) << op.name;
      EXPECT_EQ(probe.count(op.name), 3) << op.name << ": once per micro-batch";
      EXPECT_EQ(probe.calls.size(), 3u) << op.name;
    } else if (graph == "BETWEEN") {
      EXPECT_EQ(sg.run(body), How::Eager) << op.name;
      EXPECT_EQ(sg.stats().last_why, std::string("the micro-batch calls ") + op.name);
      EXPECT_GE(probe.count(op.name), 1) << op.name;
    } else {
      ASSERT_EQ(graph, "QUERY") << op.name;
      op.call(sg);
      EXPECT_EQ(probe.calls, std::vector<std::string>{op.name}) << op.name;
    }
  }
}

TEST(BackendOps, AccountCountsEveryCountedOpOnce) {
  for (const OpCase& op : kOps) {
    const std::string account = op.account;
    Probe probe;
    AccountBackend acct(probe, /*vocab=*/0, Precision::Fp32);
    acct.start(/*copy_bytes=*/16, /*gemm_n=*/2);
    probe.calls.clear();
    op.call(acct);
    long calls = 0;
    for (const account::Row& r : acct.account().rows()) calls += r.calls;
    EXPECT_EQ(probe.calls, std::vector<std::string>{op.name}) << op.name;
    if (account == "UNCOUNTED")
      EXPECT_EQ(calls, 0) << op.name;
    else
      EXPECT_EQ(calls, 1) << op.name << " (" << account << ")";
  }
}

}  // namespace
