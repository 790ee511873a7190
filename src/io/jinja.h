// io/jinja.h — the subset of Jinja that model chat templates use (tokenizer_config.json's
// "chat_template", or a folder's chat_template.jinja), rendered as Hugging Face transformers renders
// them: trim_blocks and lstrip_blocks on, one trailing newline of the template dropped, the
// loopcontrols extension ({% break %}, {% continue %}) and {% generation %} blocks (rendered as their
// body).
//
// Supported:
//   statements  {% if %}/{% elif %}/{% else %}/{% endif %}; {% for x in … %} (also `for k, v in`,
//               a trailing `if` filter, {% else %}) with loop.index, index0, revindex, revindex0,
//               first, last, length, previtem, nextitem; {% set x = … %}, {% set ns.attr = … %},
//               {% set x %}…{% endset %}; {% break %}, {% continue %}; {% generation %}; comments.
//   whitespace  {%- -%} {{- -}} {#- -#}, {%+ (no lstrip), trim_blocks and lstrip_blocks as above.
//   expressions literals (strings with Python escapes, integers, floats, true/false/none in either
//               case, lists, dicts, tuples), variables, `.attr`, `[index]`, slices `[a:b:c]`,
//               + - * / // % ** ~, unary - + not, == != < <= > >=, in / not in, and/or,
//               `a if c else b`, `is [not] TEST`, filters `|name(args)`, calls.
//   tests       defined undefined none string number integer float boolean mapping iterable sequence
//               true false even odd callable eq/equalto/== ne/!= lt gt le ge in divisibleby.
//   filters     trim length count tojson upper lower capitalize title default/d first last join
//               list string int float abs round replace reverse sort unique items dictsort
//               select reject selectattr rejectattr map(attribute=) safe e/escape wordcount sum min max.
//   functions   raise_exception(msg), namespace(...), range(...), strftime_now(fmt), dict(...).
//   methods     of strings: strip lstrip rstrip startswith endswith split rsplit upper lower title
//               capitalize replace find count join splitlines; of dicts: items keys values get;
//               of lists: index count.
// Anything else (macros, call/filter blocks, include/import/extends, other filters, tests or
// functions) is refused when the template is compiled: one ConfigError naming the construct and
// the line, before anything is rendered.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zinf/error.h"

namespace zinf::jinja {

// A template value: Python's None/bool/int/float/str/list/dict, plus Jinja's undefined. Lists and
// dicts are shared (a namespace's attributes change in place); dict keys are strings, in insertion order.
struct Value {
  enum class Kind { undefined, none, boolean, integer, number, string, list, dict };
  Kind kind = Kind::undefined;
  bool b = false;
  std::int64_t i = 0;
  double d = 0;
  std::string s;
  std::shared_ptr<std::vector<Value>> list;
  std::shared_ptr<std::vector<std::pair<std::string, Value>>> dict;
  bool is_namespace = false;

  Value() = default;
  static Value none();
  static Value boolean(bool v);
  static Value integer(std::int64_t v);
  static Value number(double v);
  static Value str(std::string v);
  static Value make_list(std::vector<Value> v = {});
  static Value make_dict();

  bool defined() const { return kind != Kind::undefined; }
  // The value of `key` in a dict (undefined when absent or not a dict).
  Value get(std::string_view key) const;
  void set(const std::string& key, Value v);  // a dict's key, replaced or appended
};

// JSON → Value (objects become dicts, in the document's order).
Value from_json(const nlohmann::json& j);

// An error the template itself raises while rendering (raise_exception, a type error, an undefined
// value's attribute): the message names the cause.
struct RenderError : Error {
  using Error::Error;
};

struct Template;  // compiled

// Compiles `text`; `what` names it in errors ("tokenizer_config.json chat_template"). A construct
// outside the subset is one ConfigError: "<what>: line N: <construct> is not supported by zinf's
// template renderer".
std::shared_ptr<const Template> compile(std::string_view text, const std::string& what);

// Renders with the variables of `context` (a dict). Throws RenderError.
std::string render(const Template& t, const Value& context);

}  // namespace zinf::jinja
