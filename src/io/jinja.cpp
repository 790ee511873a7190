// jinja.cpp — the chat-template subset of Jinja (io/jinja.h): a lexer that applies the whitespace
// rules, a recursive-descent parser to a tree, and a tree-walking renderer.
#include "io/jinja.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <set>

namespace zinf::jinja {

// ---------------------------------------------------------------------------------------------
// Values

Value Value::none() {
  Value v;
  v.kind = Kind::none;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::boolean;
  v.b = x;
  return v;
}
Value Value::integer(std::int64_t x) {
  Value v;
  v.kind = Kind::integer;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::number;
  v.d = x;
  return v;
}
Value Value::str(std::string x) {
  Value v;
  v.kind = Kind::string;
  v.s = std::move(x);
  return v;
}
Value Value::make_list(std::vector<Value> x) {
  Value v;
  v.kind = Kind::list;
  v.list = std::make_shared<std::vector<Value>>(std::move(x));
  return v;
}
Value Value::make_dict() {
  Value v;
  v.kind = Kind::dict;
  v.dict = std::make_shared<std::vector<std::pair<std::string, Value>>>();
  return v;
}
Value Value::get(std::string_view key) const {
  if (kind != Kind::dict) return {};
  for (const auto& [k, v] : *dict)
    if (k == key) return v;
  return {};
}
void Value::set(const std::string& key, Value v) {
  for (auto& [k, old] : *dict)
    if (k == key) {
      old = std::move(v);
      return;
    }
  dict->emplace_back(key, std::move(v));
}

Value from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return Value::integer(j.get<std::int64_t>());
    case nlohmann::json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::json::value_t::string: return Value::str(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> l;
      for (const auto& e : j) l.push_back(from_json(e));
      return Value::make_list(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::make_dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.dict->emplace_back(it.key(), from_json(it.value()));
      return d;
    }
    default: return {};
  }
}

namespace {

using K = Value::Kind;

// UTF-8 helpers: code points for length, indexing and slicing of strings, Python's whitespace.
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::uint32_t decode_cp(const std::string& c) {
  const auto b = [&](std::size_t k) { return static_cast<std::uint32_t>(static_cast<unsigned char>(c[k])); };
  if (c.size() == 1) return b(0);
  if (c.size() == 2) return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
  if (c.size() == 3) return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

void append_cp(std::string& s, std::uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
bool py_space(std::uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// Python's str.strip / lstrip / rstrip: whitespace, or any of `chars` when given.
std::string py_strip(const std::string& s, bool left, bool right, const std::string* chars = nullptr) {
  const std::vector<std::string> cps = code_points(s);
  std::set<std::string> set;
  if (chars)
    for (auto& c : code_points(*chars)) set.insert(c);
  const auto strip = [&](const std::string& c) { return chars ? set.count(c) > 0 : py_space(decode_cp(c)); };
  std::size_t a = 0, b = cps.size();
  if (left)
    while (a < b && strip(cps[a])) ++a;
  if (right)
    while (b > a && strip(cps[b - 1])) --b;
  std::string out;
  for (std::size_t k = a; k < b; ++k) out += cps[k];
  return out;
}

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string py_repr_str(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += c;
    }
  }
  return out + q;
}

std::string to_str(const Value& v, bool repr = false);

std::string to_str(const Value& v, bool repr) {
  switch (v.kind) {
    case K::undefined: return "";
    case K::none: return "None";
    case K::boolean: return v.b ? "True" : "False";
    case K::integer: return std::to_string(v.i);
    case K::number: return py_float(v.d);
    case K::string: return repr ? py_repr_str(v.s) : v.s;
    case K::list: {
      std::string o = "[";
      for (std::size_t k = 0; k < v.list->size(); ++k) o += (k ? ", " : "") + to_str((*v.list)[k], true);
      return o + "]";
    }
    case K::dict: {
      std::string o = "{";
      bool first = true;
      for (const auto& [k, x] : *v.dict) {
        o += (first ? "" : ", ") + py_repr_str(k) + ": " + to_str(x, true);
        first = false;
      }
      return o + "}";
    }
  }
  return "";
}

void json_string(std::string& o, const std::string& s) {
  o += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      default:
        if (u < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", u);
          o += buf;
        } else {
          o += c;
        }
    }
  }
  o += '"';
}

// Python's json.dumps(v, ensure_ascii=False, indent=indent) (transformers' tojson): ", " and ": "
// without an indent; "," and ": " with one, each item on its own line.
void to_json(std::string& o, const Value& v, int indent, int depth) {
  const auto nl = [&](int d) {
    if (indent < 0) return;
    o += '\n';
    o.append(static_cast<std::size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case K::undefined:
    case K::none: o += "null"; return;
    case K::boolean: o += v.b ? "true" : "false"; return;
    case K::integer: o += std::to_string(v.i); return;
    case K::number:
      o += std::isnan(v.d) ? "NaN" : std::isinf(v.d) ? (v.d > 0 ? "Infinity" : "-Infinity") : py_float(v.d);
      return;
    case K::string: json_string(o, v.s); return;
    case K::list:
      if (v.list->empty()) {
        o += "[]";
        return;
      }
      o += '[';
      for (std::size_t k = 0; k < v.list->size(); ++k) {
        if (k) o += indent < 0 ? ", " : ",";
        nl(depth + 1);
        to_json(o, (*v.list)[k], indent, depth + 1);
      }
      nl(depth);
      o += ']';
      return;
    case K::dict:
      if (v.dict->empty()) {
        o += "{}";
        return;
      }
      o += '{';
      for (std::size_t k = 0; k < v.dict->size(); ++k) {
        if (k) o += indent < 0 ? ", " : ",";
        nl(depth + 1);
        json_string(o, (*v.dict)[k].first);
        o += ": ";
        to_json(o, (*v.dict)[k].second, indent, depth + 1);
      }
      nl(depth);
      o += '}';
      return;
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case K::undefined:
    case K::none: return false;
    case K::boolean: return v.b;
    case K::integer: return v.i != 0;
    case K::number: return v.d != 0;
    case K::string: return !v.s.empty();
    case K::list: return !v.list->empty();
    case K::dict: return !v.dict->empty();
  }
  return false;
}

bool numeric(const Value& v) { return v.kind == K::integer || v.kind == K::number || v.kind == K::boolean; }
double as_double(const Value& v) {
  return v.kind == K::number ? v.d : v.kind == K::boolean ? (v.b ? 1 : 0) : static_cast<double>(v.i);
}
std::int64_t as_int(const Value& v) {
  if (v.kind == K::number) {  // truncated, and held inside the 64-bit range
    if (!(v.d > -9.2e18)) return v.d != v.d ? 0 : INT64_MIN;
    if (!(v.d < 9.2e18)) return INT64_MAX;
    return static_cast<std::int64_t>(v.d);
  }
  return v.kind == K::boolean ? (v.b ? 1 : 0) : v.i;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case K::undefined: return "undefined";
    case K::none: return "None";
    case K::boolean: return "bool";
    case K::integer: return "int";
    case K::number: return "float";
    case K::string: return "str";
    case K::list: return "list";
    case K::dict: return v.is_namespace ? "namespace" : "dict";
  }
  return "?";
}

bool equal(const Value& a, const Value& b) {
  if (numeric(a) && numeric(b)) return as_double(a) == as_double(b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::undefined:
    case K::none: return true;
    case K::string: return a.s == b.s;
    case K::list:
      if (a.list->size() != b.list->size()) return false;
      for (std::size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case K::dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict)
        if (!equal(v, b.get(k)) || !b.get(k).defined()) return false;
      return true;
    default: return false;
  }
}

// -1, 0, 1; a RenderError for values Python does not order.
int compare(const Value& a, const Value& b) {
  if (numeric(a) && numeric(b)) {
    const double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == K::string && b.kind == K::string) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.kind == K::list && b.kind == K::list) {
    for (std::size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k)
      if (const int c = compare((*a.list)[k], (*b.list)[k]); c) return c;
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  throw RenderError("cannot order " + type_name(a) + " and " + type_name(b));
}

bool contains(const Value& hay, const Value& needle) {
  switch (hay.kind) {
    case K::string:
      if (needle.kind != K::string) throw RenderError("'in <string>' needs a string on the left");
      return hay.s.find(needle.s) != std::string::npos;
    case K::list:
      return std::any_of(hay.list->begin(), hay.list->end(), [&](const Value& e) { return equal(e, needle); });
    case K::dict: return needle.kind == K::string && hay.get(needle.s).defined();
    case K::undefined: throw RenderError("'in' on an undefined value");
    default: throw RenderError("'in' on a " + type_name(hay));
  }
}

// The items a for loop (or a filter) walks: a list's elements, a dict's keys, a string's characters.
std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case K::undefined: return {};
    case K::list: return *v.list;
    case K::dict: {
      std::vector<Value> out;
      for (const auto& [k, x] : *v.dict) out.push_back(Value::str(k));
      return out;
    }
    case K::string: {
      std::vector<Value> out;
      for (auto& c : code_points(v.s)) out.push_back(Value::str(c));
      return out;
    }
    default: throw RenderError("a " + type_name(v) + " is not iterable");
  }
}

Value dict_items(const Value& d) {
  std::vector<Value> out;
  for (const auto& [k, x] : *d.dict) out.push_back(Value::make_list({Value::str(k), x}));
  return Value::make_list(std::move(out));
}

// ---------------------------------------------------------------------------------------------
// Lexer: the template as text pieces and tags, with the whitespace rules applied.

enum class Tok { name, string, integer, number, op, end };
struct Token {
  Tok type;
  std::string text;
  int line;
};

struct Piece {  // one part of the template
  enum Type { text_piece, output, statement } type;
  std::string text;           // text
  std::vector<Token> tokens;  // output/statement: the expression's tokens, ending with Tok::end
  int line;
};

[[noreturn]] void refuse(const std::string& what, int line, const std::string& construct) {
  throw ConfigError(what + ": line " + std::to_string(line) + ": " + construct +
                        " is not supported by zinf's chat template renderer",
                    "use a built-in chat format (data.chat_template llama3, chatml, qwen2 or none), or a template "
                    "within the subset docs/finetune.md lists");
}

[[noreturn]] void syntax(const std::string& what, int line, const std::string& why) {
  throw ConfigError(what + ": line " + std::to_string(line) + ": " + why);
}

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& what) : what_(what) {
    // Line endings become "\n" and one trailing newline is dropped (Jinja's defaults).
    for (std::size_t k = 0; k < src.size(); ++k) {
      if (src[k] == '\r') {
        s_ += '\n';
        if (k + 1 < src.size() && src[k + 1] == '\n') ++k;
      } else {
        s_ += src[k];
      }
    }
    if (!s_.empty() && s_.back() == '\n') s_.pop_back();
  }

  std::vector<Piece> run() {
    std::vector<Piece> out;
    std::size_t pos = 0;
    bool line_start = true;  // the text that follows starts a line (template start, or a tag ate "\n")
    bool strip_next = false;
    while (pos <= s_.size()) {
      std::size_t open = pos;
      while (true) {
        open = s_.find('{', open);
        if (open == std::string::npos || open + 1 >= s_.size()) {
          open = std::string::npos;
          break;
        }
        const char c = s_[open + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++open;
      }
      std::string text = s_.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
      if (strip_next) text = lstrip_all(text);
      if (open == std::string::npos) {
        if (!text.empty()) out.push_back({Piece::text_piece, text, {}, line_of(pos)});
        break;
      }
      const char kind = s_[open + 1];
      std::size_t p = open + 2;
      const char mod = p < s_.size() ? s_[p] : '\0';
      if (mod == '-' || mod == '+') ++p;
      if (mod == '-') {
        text = rstrip_all(text);
      } else if (mod != '+' && kind != '{') {  // lstrip_blocks
        const std::size_t nl = text.rfind('\n');
        const std::size_t l = nl == std::string::npos ? 0 : nl + 1;
        if ((nl != std::string::npos || line_start) &&
            text.find_first_not_of(" \t\v\f", l) == std::string::npos)
          text.erase(l);
      }
      if (!text.empty()) out.push_back({Piece::text_piece, text, {}, line_of(pos)});
      const int line = line_of(open);
      bool strip_after = false;
      if (kind == '#') {
        const std::size_t close = s_.find("#}", p);
        if (close == std::string::npos) syntax(what_, line, "a comment {# without #}");
        strip_after = close > p && s_[close - 1] == '-';
        pos = close + 2;
      } else {
        Piece piece{kind == '{' ? Piece::output : Piece::statement, {}, {}, line};
        pos = lex_expr(p, kind == '{' ? '}' : '%', piece.tokens, strip_after);
        out.push_back(std::move(piece));
      }
      line_start = false;
      if (kind != '{' && !strip_after && pos < s_.size() && s_[pos] == '\n') {  // trim_blocks
        ++pos;
        line_start = true;
      }
      strip_next = strip_after;
      if (pos >= s_.size()) break;
    }
    return out;
  }

 private:
  static std::string lstrip_all(const std::string& t) {
    const std::size_t k = t.find_first_not_of(" \t\n\r\v\f");
    return k == std::string::npos ? std::string() : t.substr(k);
  }
  static std::string rstrip_all(const std::string& t) {
    const std::size_t k = t.find_last_not_of(" \t\n\r\v\f");
    return k == std::string::npos ? std::string() : t.substr(0, k + 1);
  }
  int line_of(std::size_t pos) const {
    return 1 + static_cast<int>(std::count(s_.begin(), s_.begin() + static_cast<std::ptrdiff_t>(std::min(pos, s_.size())), '\n'));
  }

  // Tokens up to the closing "}}" / "%}" (with an optional "-" before it); returns the position after it.
  std::size_t lex_expr(std::size_t p, char close, std::vector<Token>& toks, bool& strip_after) {
    int depth = 0;
    while (true) {
      while (p < s_.size() && std::isspace(static_cast<unsigned char>(s_[p]))) ++p;
      const int line = line_of(p);
      if (p >= s_.size()) syntax(what_, line, std::string("a tag without its closing ") + close + "}");
      if (depth == 0) {
        if (s_.compare(p, 3, std::string("-") + close + "}") == 0) {
          strip_after = true;
          toks.push_back({Tok::end, "", line});
          return p + 3;
        }
        if (s_.compare(p, 3, std::string("+") + close + "}") == 0) {
          toks.push_back({Tok::end, "", line});
          return p + 3;
        }
        if (s_[p] == close && p + 1 < s_.size() && s_[p + 1] == '}') {
          toks.push_back({Tok::end, "", line});
          return p + 2;
        }
      }
      const char c = s_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        std::size_t e = p;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
        toks.push_back({Tok::name, s_.substr(p, e - p), line});
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        std::size_t e = p;
        bool flt = false;
        while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
        if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
          flt = true;
          ++e;
          while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
        }
        if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
          std::size_t f = e + 1;
          if (f < s_.size() && (s_[f] == '+' || s_[f] == '-')) ++f;
          if (f < s_.size() && std::isdigit(static_cast<unsigned char>(s_[f]))) {
            flt = true;
            e = f;
            while (e < s_.size() && std::isdigit(static_cast<unsigned char>(s_[e]))) ++e;
          }
        }
        std::string num = s_.substr(p, e - p);
        num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
        toks.push_back({flt ? Tok::number : Tok::integer, num, line});
        p = e;
      } else if (c == '\'' || c == '"') {
        std::string v;
        std::size_t e = p + 1;
        while (true) {
          if (e >= s_.size()) syntax(what_, line, "a string literal without its closing quote");
          if (s_[e] == c) break;
          if (s_[e] == '\\' && e + 1 < s_.size()) {
            e = unescape(e, v, line);
            continue;
          }
          v += s_[e++];
        }
        toks.push_back({Tok::string, v, line});
        p = e + 1;
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ",", ".",
                                    ":",  "|",  "~",  "+",  "-",  "*",  "/", "%", "<", ">", "="};
        std::string op;
        for (const char* o : ops)
          if (s_.compare(p, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        if (op.empty()) syntax(what_, line, std::string("unexpected character '") + c + "'");
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        toks.push_back({Tok::op, op, line});
        p += op.size();
      }
    }
  }

  // One escape of a string literal (as Python's unicode-escape reads it); returns the position after it.
  std::size_t unescape(std::size_t e, std::string& v, int line) {
    const char n = s_[e + 1];
    const auto hex = [&](std::size_t at, int digits) {
      if (at + static_cast<std::size_t>(digits) > s_.size()) syntax(what_, line, "a truncated \\x, \\u or \\U escape");
      std::uint32_t cp = 0;
      for (int k = 0; k < digits; ++k) {
        const char h = s_[at + static_cast<std::size_t>(k)];
        if (!std::isxdigit(static_cast<unsigned char>(h))) syntax(what_, line, "a malformed \\x, \\u or \\U escape");
        cp = cp * 16 + static_cast<std::uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      append_cp(v, cp);
      return at + static_cast<std::size_t>(digits);
    };
    switch (n) {
      case 'n': v += '\n'; return e + 2;
      case 't': v += '\t'; return e + 2;
      case 'r': v += '\r'; return e + 2;
      case '\\': v += '\\'; return e + 2;
      case '\'': v += '\''; return e + 2;
      case '"': v += '"'; return e + 2;
      case 'a': v += '\a'; return e + 2;
      case 'b': v += '\b'; return e + 2;
      case 'f': v += '\f'; return e + 2;
      case 'v': v += '\v'; return e + 2;
      case '\n': return e + 2;  // a line continuation
      case 'x': return hex(e + 2, 2);
      case 'u': return hex(e + 2, 4);
      case 'U': return hex(e + 2, 8);
      default:
        if (n >= '0' && n <= '7') {
          std::uint32_t cp = 0;
          std::size_t k = e + 1;
          for (int d = 0; d < 3 && k < s_.size() && s_[k] >= '0' && s_[k] <= '7'; ++d, ++k) cp = cp * 8 + static_cast<std::uint32_t>(s_[k] - '0');
          append_cp(v, cp);
          return k;
        }
        v += '\\';  // unknown escapes stay as written
        return e + 1;
    }
  }

  std::string s_;
  const std::string& what_;
};

// ---------------------------------------------------------------------------------------------
// Tree

struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Arg {
  std::string name;  // empty: positional
  ExprP value;
};
struct Expr {
  enum Type { literal, var, attr, index, slice, call, filter, test, unary, binary, logic, ternary, list, dict } type;
  Value lit;
  std::string name;  // var, attr, call target name (function or method), filter, test, operator
  std::vector<ExprP> kids;  // operands; slice: object, start, stop, step (null: absent)
  std::vector<Arg> args;    // call, filter, test
  bool negate = false;      // test: `is not`
  int line = 0;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;
struct Node {
  enum Type { text_node, output, if_, for_, set, set_block, break_, continue_, generation } type;
  std::string text;
  ExprP expr;                                        // output, set value, for iterable, for filter: cond
  ExprP cond;                                        // for: the `if` filter
  std::vector<std::pair<ExprP, Body>> branches;      // if: conditions and bodies
  Body body, else_body;                              // for / set_block / generation; if/for else
  std::vector<std::string> targets;                  // for: loop variables; set: name (and attr)
  std::string attr;                                  // set ns.attr
  int line = 0;
};

}  // namespace

struct Template {
  Body body;
};

namespace {

const std::set<std::string> kFilters = {
    "trim",   "length", "count",  "tojson",     "upper",      "lower", "capitalize", "title",     "default",
    "d",      "first",  "last",   "join",       "list",       "string", "int",       "float",     "abs",
    "round",  "replace", "reverse", "sort",     "unique",     "items", "dictsort",   "select",    "reject",
    "selectattr", "rejectattr", "map", "safe",  "e",          "escape", "wordcount", "sum",       "min",
    "max"};
const std::set<std::string> kTests = {"defined", "undefined", "none",  "string", "number", "integer", "float",
                                      "boolean", "mapping",   "iterable", "sequence", "true", "false", "even",
                                      "odd",     "callable",  "eq",    "equalto", "==", "ne", "!=", "lt", "gt",
                                      "le",      "ge",        "in",    "divisibleby", "sameas", "lessthan",
                                      "greaterthan"};
const std::set<std::string> kFunctions = {"raise_exception", "namespace", "range", "strftime_now", "dict"};
const std::set<std::string> kMethods = {"strip",  "lstrip", "rstrip", "startswith", "endswith", "split",
                                        "rsplit", "upper",  "lower",  "title",      "capitalize", "replace",
                                        "find",   "count",  "join",   "splitlines", "items",    "keys",
                                        "values", "get",    "index"};

class Parser {
 public:
  Parser(std::vector<Piece> pieces, const std::string& what) : pieces_(std::move(pieces)), what_(what) {}

  Body parse() {
    Body b = block({});
    if (at_ < pieces_.size()) syntax(what_, pieces_[at_].line, "{% " + stmt_name(pieces_[at_]) + " %} without its opening tag");
    return b;
  }

 private:
  static std::string stmt_name(const Piece& p) { return p.tokens.empty() ? "" : p.tokens[0].text; }

  // Nodes up to one of `ends` (a statement name), which is left unconsumed.
  Body block(const std::set<std::string>& ends) {
    const Depth guard(*this, at_ < pieces_.size() ? pieces_[at_].line : 1);
    Body b;
    while (at_ < pieces_.size()) {
      Piece& p = pieces_[at_];
      if (p.type == Piece::text_piece) {
        auto n = std::make_unique<Node>();
        n->type = Node::text_node;
        n->text = p.text;
        b.push_back(std::move(n));
        ++at_;
        continue;
      }
      toks_ = &p.tokens;
      k_ = 0;
      if (p.type == Piece::output) {
        auto n = std::make_unique<Node>();
        n->type = Node::output;
        n->line = p.line;
        n->expr = expression();
        expect_end();
        b.push_back(std::move(n));
        ++at_;
        continue;
      }
      const Token& t = peek();
      if (t.type != Tok::name) syntax(what_, t.line, "a statement must start with a name");
      if (ends.count(t.text)) return b;
      ++at_;
      b.push_back(statement(p.line));
    }
    if (!ends.empty()) syntax(what_, pieces_.empty() ? 1 : pieces_.back().line, "{% " + *ends.rbegin() + " %} is missing");
    return b;
  }

  // The statement at toks_ (its piece consumed).
  std::unique_ptr<Node> statement(int line) {
    const std::string name = next().text;
    auto n = std::make_unique<Node>();
    n->line = line;
    if (name == "if") {
      n->type = Node::if_;
      ExprP c = expression();
      expect_end();
      while (true) {
        Body body = block({"elif", "else", "endif"});
        n->branches.emplace_back(std::move(c), std::move(body));
        enter();
        const std::string e = next().text;
        if (e == "elif") {
          c = expression();
          expect_end();
          continue;
        }
        expect_end();
        if (e == "else") {
          n->else_body = block({"endif"});
          enter();
          next();
          expect_end();
        }
        break;
      }
      return n;
    }
    if (name == "for") {
      n->type = Node::for_;
      n->targets.push_back(name_token());
      while (accept(",")) n->targets.push_back(name_token());
      if (!accept_name("in")) syntax(what_, line, "expected 'in' in a for loop");
      n->expr = expression(false);
      if (accept_name("if")) n->cond = expression(false);
      if (accept_name("recursive")) refuse(what_, line, "a recursive for loop");
      expect_end();
      n->body = block({"else", "endfor"});
      enter();
      if (next().text == "else") {
        expect_end();
        n->else_body = block({"endfor"});
        enter();
        next();
      }
      expect_end();
      return n;
    }
    if (name == "set") {
      const std::string target = name_token();
      n->targets.push_back(target);
      if (accept(".")) n->attr = name_token();
      if (peek().type == Tok::op && peek().text == ",") refuse(what_, line, "{% set a, b = … %} (unpacking)");
      if (peek().type == Tok::end) {
        if (!n->attr.empty()) refuse(what_, line, "a block {% set x.attr %}");
        n->type = Node::set_block;
        expect_end();
        n->body = block({"endset"});
        enter();
        next();
        expect_end();
        return n;
      }
      n->type = Node::set;
      if (!accept("=")) syntax(what_, line, "expected '=' in {% set %}");
      n->expr = expression();
      expect_end();
      return n;
    }
    if (name == "break" || name == "continue") {
      n->type = name == "break" ? Node::break_ : Node::continue_;
      expect_end();
      return n;
    }
    if (name == "generation") {
      n->type = Node::generation;
      expect_end();
      n->body = block({"endgeneration"});
      enter();
      next();
      expect_end();
      return n;
    }
    if (name == "elif" || name == "else" || name == "endif" || name == "endfor" || name == "endset" ||
        name == "endgeneration")
      syntax(what_, line, "{% " + name + " %} without its opening tag");
    refuse(what_, line, "the statement {% " + name + " %}");
  }

  void enter() {  // the statement piece at at_ (a block's end, which block() left unconsumed)
    toks_ = &pieces_[at_].tokens;
    k_ = 0;
    ++at_;
  }

  const Token& peek(std::size_t ahead = 0) const { return (*toks_)[std::min(k_ + ahead, toks_->size() - 1)]; }
  const Token& next() {
    const Token& t = peek();
    if (k_ < toks_->size() - 1) ++k_;
    return t;
  }
  bool accept(const std::string& op) {
    if (peek().type == Tok::op && peek().text == op) {
      next();
      return true;
    }
    return false;
  }
  bool accept_name(const std::string& n) {
    if (peek().type == Tok::name && peek().text == n) {
      next();
      return true;
    }
    return false;
  }
  void expect(const std::string& op) {
    if (!accept(op)) syntax(what_, peek().line, "expected '" + op + "'" + got());
  }
  std::string got() const {
    return peek().type == Tok::end ? " before the tag's end" : " at '" + peek().text + "'";
  }
  void expect_end() {
    if (peek().type != Tok::end) syntax(what_, peek().line, "unexpected '" + peek().text + "' in a tag");
  }
  std::string name_token() {
    if (peek().type != Tok::name) syntax(what_, peek().line, "expected a name" + got());
    return next().text;
  }

  ExprP make(Expr::Type t, int line) {
    auto e = std::make_unique<Expr>();
    e->type = t;
    e->line = line;
    return e;
  }

  // Nesting (parentheses, lists, blocks) is bounded, so that no template exhausts the stack.
  struct Depth {
    Parser& p;
    explicit Depth(Parser& parser, int line) : p(parser) {
      if (++p.depth_ > kMaxDepth) syntax(p.what_, line, "nesting deeper than " + std::to_string(kMaxDepth));
    }
    ~Depth() { --p.depth_; }
  };
  static constexpr int kMaxDepth = 200;

  // expression := or ['if' or ['else' expression]]
  ExprP expression(bool with_ternary = true) {
    const Depth guard(*this, peek().line);
    ExprP e = parse_or();
    if (with_ternary && peek().type == Tok::name && peek().text == "if") {
      const int line = next().line;
      auto t = make(Expr::ternary, line);
      ExprP cond = parse_or();
      ExprP other;
      if (accept_name("else")) other = expression();
      t->kids.push_back(std::move(cond));
      t->kids.push_back(std::move(e));
      t->kids.push_back(std::move(other));  // may be null: undefined
      return t;
    }
    return e;
  }
  ExprP parse_or() {
    ExprP l = parse_and();
    while (peek().type == Tok::name && peek().text == "or") {
      auto n = make(Expr::logic, next().line);
      n->name = "or";
      n->kids.push_back(std::move(l));
      n->kids.push_back(parse_and());
      l = std::move(n);
    }
    return l;
  }
  ExprP parse_and() {
    ExprP l = parse_not();
    while (peek().type == Tok::name && peek().text == "and") {
      auto n = make(Expr::logic, next().line);
      n->name = "and";
      n->kids.push_back(std::move(l));
      n->kids.push_back(parse_not());
      l = std::move(n);
    }
    return l;
  }
  ExprP parse_not() {
    const Depth guard(*this, peek().line);
    if (peek().type == Tok::name && peek().text == "not") {
      auto n = make(Expr::unary, next().line);
      n->name = "not";
      n->kids.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP l = parse_math1();
    while (true) {
      std::string op;
      const Token& t = peek();
      if (t.type == Tok::op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" ||
                                t.text == ">" || t.text == ">=")) {
        op = t.text;
        next();
      } else if (t.type == Tok::name && t.text == "in") {
        op = "in";
        next();
      } else if (t.type == Tok::name && t.text == "not" && peek(1).type == Tok::name && peek(1).text == "in") {
        op = "not in";
        next();
        next();
      } else {
        return l;
      }
      auto n = make(Expr::binary, t.line);
      n->name = op;
      n->kids.push_back(std::move(l));
      n->kids.push_back(parse_math1());
      l = std::move(n);
    }
  }
  ExprP binary_chain(const std::set<std::string>& ops, ExprP (Parser::*sub)()) {
    ExprP l = (this->*sub)();
    while (peek().type == Tok::op && ops.count(peek().text)) {
      auto n = make(Expr::binary, peek().line);
      n->name = next().text;
      n->kids.push_back(std::move(l));
      n->kids.push_back((this->*sub)());
      l = std::move(n);
    }
    return l;
  }
  ExprP parse_math1() { return binary_chain({"+", "-"}, &Parser::parse_concat); }
  ExprP parse_concat() { return binary_chain({"~"}, &Parser::parse_math2); }
  ExprP parse_math2() { return binary_chain({"*", "/", "//", "%"}, &Parser::parse_pow); }
  ExprP parse_pow() { return binary_chain({"**"}, &Parser::parse_unary); }
  ExprP parse_unary() {
    const Depth guard(*this, peek().line);
    if (peek().type == Tok::op && (peek().text == "-" || peek().text == "+")) {
      auto n = make(Expr::unary, peek().line);
      n->name = next().text;
      n->kids.push_back(parse_unary());
      return filters(std::move(n));
    }
    return filters(postfix(primary()));
  }

  std::vector<Arg> call_args() {  // after '('
    std::vector<Arg> args;
    if (accept(")")) return args;
    do {
      Arg a;
      if (peek().type == Tok::name && peek(1).type == Tok::op && peek(1).text == "=") {
        a.name = next().text;
        next();
      }
      a.value = expression();
      args.push_back(std::move(a));
    } while (accept(","));
    expect(")");
    return args;
  }

  ExprP primary() {
    const Token t = next();
    switch (t.type) {
      case Tok::string: {
        auto e = make(Expr::literal, t.line);
        e->lit = Value::str(t.text);
        while (peek().type == Tok::string) e->lit.s += next().text;  // adjacent literals join
        return e;
      }
      case Tok::integer: {
        auto e = make(Expr::literal, t.line);
        std::int64_t v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc() || r.ptr != t.text.data() + t.text.size())
          syntax(what_, t.line, "the integer " + t.text + " is out of range");
        e->lit = Value::integer(v);
        return e;
      }
      case Tok::number: {
        auto e = make(Expr::literal, t.line);
        e->lit = Value::number(std::strtod(t.text.c_str(), nullptr));
        return e;
      }
      case Tok::name: {
        auto e = make(Expr::literal, t.line);
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          e->lit = Value::boolean(t.text[0] == 't' || t.text[0] == 'T');
          return e;
        }
        if (t.text == "none" || t.text == "None") {
          e->lit = Value::none();
          return e;
        }
        if (peek().type == Tok::op && peek().text == "(") {
          if (!kFunctions.count(t.text)) refuse(what_, t.line, "the function " + t.text + "()");
          next();
          auto c = make(Expr::call, t.line);
          c->name = t.text;
          c->args = call_args();
          return c;
        }
        auto v = make(Expr::var, t.line);
        v->name = t.text;
        return v;
      }
      case Tok::op:
        if (t.text == "(") {
          ExprP e = expression();
          if (accept(",")) {  // a tuple: a list here
            auto l = make(Expr::list, t.line);
            l->kids.push_back(std::move(e));
            while (peek().type != Tok::op || peek().text != ")") {
              l->kids.push_back(expression());
              if (!accept(",")) break;
            }
            expect(")");
            return l;
          }
          expect(")");
          return e;
        }
        if (t.text == "[") {
          auto l = make(Expr::list, t.line);
          while (!accept("]")) {
            l->kids.push_back(expression());
            if (!accept(",")) {
              expect("]");
              break;
            }
          }
          return l;
        }
        if (t.text == "{") {
          auto d = make(Expr::dict, t.line);
          while (!accept("}")) {
            d->kids.push_back(expression());
            expect(":");
            d->kids.push_back(expression());
            if (!accept(",")) {
              expect("}");
              break;
            }
          }
          return d;
        }
        break;
      case Tok::end: syntax(what_, t.line, "an expression is missing");
    }
    syntax(what_, t.line, "unexpected '" + t.text + "'");
  }

  ExprP postfix(ExprP e) {
    while (true) {
      if (accept(".")) {
        const int line = peek().line;
        std::string name = peek().type == Tok::integer ? next().text : name_token();
        if (peek().type == Tok::op && peek().text == "(") {
          if (!kMethods.count(name)) refuse(what_, line, "the method ." + name + "()");
          next();
          auto c = make(Expr::call, line);
          c->name = name;
          c->kids.push_back(std::move(e));
          c->args = call_args();
          e = std::move(c);
          continue;
        }
        auto a = make(Expr::attr, line);
        a->name = name;
        a->kids.push_back(std::move(e));
        e = std::move(a);
      } else if (peek().type == Tok::op && peek().text == "[") {
        const int line = next().line;
        ExprP parts[3];
        bool is_slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!(peek().type == Tok::op && (peek().text == ":" || peek().text == "]"))) parts[k] = expression();
          if (k < 2 && accept(":")) {
            is_slice = true;
            continue;
          }
          break;
        }
        expect("]");
        if (is_slice) {
          auto s = make(Expr::slice, line);
          s->kids.push_back(std::move(e));
          for (auto& p : parts) s->kids.push_back(std::move(p));
          e = std::move(s);
        } else {
          if (!parts[0]) syntax(what_, line, "an empty subscript []");
          auto i = make(Expr::index, line);
          i->kids.push_back(std::move(e));
          i->kids.push_back(std::move(parts[0]));
          e = std::move(i);
        }
      } else if (peek().type == Tok::op && peek().text == "(") {
        refuse(what_, peek().line, "calling a value that is not a known function or method");
      } else {
        return e;
      }
    }
  }

  ExprP filters(ExprP e) {
    while (true) {
      if (accept("|")) {
        const int line = peek().line;
        const std::string name = name_token();
        if (!kFilters.count(name)) refuse(what_, line, "the filter |" + name);
        auto f = make(Expr::filter, line);
        f->name = name;
        f->kids.push_back(std::move(e));
        if (accept("(")) f->args = call_args();
        e = std::move(f);
      } else if (peek().type == Tok::name && peek().text == "is") {
        const int line = next().line;
        auto t = make(Expr::test, line);
        t->negate = accept_name("not");
        std::string name;
        if (peek().type == Tok::name) {
          name = next().text;
        } else if (peek().type == Tok::op && (peek().text == "==" || peek().text == "!=")) {
          name = next().text;
        } else {
          syntax(what_, line, "expected a test name after 'is'" + got());
        }
        if (!kTests.count(name)) refuse(what_, line, "the test 'is " + name + "'");
        t->name = name;
        t->kids.push_back(std::move(e));
        if (accept("(")) {
          t->args = call_args();
        } else if (peek().type == Tok::string || peek().type == Tok::integer || peek().type == Tok::number ||
                   (peek().type == Tok::name && peek().text != "and" && peek().text != "or" &&
                    peek().text != "else" && peek().text != "if" && peek().text != "in" && peek().text != "not" &&
                    peek().text != "is")) {
          Arg a;  // `is divisibleby 3`, `is sameas none`: one argument without parentheses
          a.value = postfix(primary());
          t->args.push_back(std::move(a));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Piece> pieces_;
  const std::string& what_;
  std::size_t at_ = 0;
  std::vector<Token>* toks_ = nullptr;
  std::size_t k_ = 0;
  int depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Renderer

struct BreakSignal {};
struct ContinueSignal {};

class Renderer {
 public:
  explicit Renderer(const Value& ctx) { scopes_.push_back(ctx.kind == K::dict ? *ctx.dict : Scope{}); }

  void run(const Body& b, std::string& out) {
    for (const auto& n : b) node(*n, out);
  }

 private:
  using Scope = std::vector<std::pair<std::string, Value>>;

  [[noreturn]] static void fail(const Expr& e, const std::string& why) {
    throw RenderError("line " + std::to_string(e.line) + ": " + why);
  }

  Value lookup(const std::string& name) const {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s)
      for (const auto& [k, v] : *s)
        if (k == name) return v;
    return {};
  }
  void assign(const std::string& name, Value v) {
    Scope& s = scopes_.back();
    for (auto& [k, old] : s)
      if (k == name) {
        old = std::move(v);
        return;
      }
    s.emplace_back(name, std::move(v));
  }

  void node(const Node& n, std::string& out) {
    switch (n.type) {
      case Node::text_node: out += n.text; return;
      case Node::output: out += to_str(eval(*n.expr)); return;
      case Node::if_:
        for (const auto& [c, body] : n.branches)
          if (truthy(eval(*c))) {
            run(body, out);
            return;
          }
        run(n.else_body, out);
        return;
      case Node::for_: loop(n, out); return;
      case Node::set: {
        Value v = eval(*n.expr);
        if (n.attr.empty()) {
          assign(n.targets[0], std::move(v));
          return;
        }
        Value ns = lookup(n.targets[0]);
        if (ns.kind != K::dict || !ns.is_namespace)
          throw RenderError("line " + std::to_string(n.line) + ": {% set " + n.targets[0] + "." + n.attr +
                            " %} needs a namespace()");
        ns.set(n.attr, std::move(v));
        return;
      }
      case Node::set_block: {
        std::string s;
        run(n.body, s);
        assign(n.targets[0], Value::str(std::move(s)));
        return;
      }
      case Node::break_: throw BreakSignal{};
      case Node::continue_: throw ContinueSignal{};
      case Node::generation: run(n.body, out); return;
    }
  }

  void loop(const Node& n, std::string& out) {
    const Value seq = eval(*n.expr);
    std::vector<Value> items = iterate(seq);
    if (seq.kind == K::dict && n.targets.size() == 2) items = *dict_items(seq).list;
    const auto bind = [&](const Value& item) {
      if (n.targets.size() == 1) {
        assign(n.targets[0], item);
        return;
      }
      const std::vector<Value> parts = iterate(item);
      if (parts.size() != n.targets.size())
        throw RenderError("line " + std::to_string(n.line) + ": cannot unpack " + std::to_string(parts.size()) +
                          " values into " + std::to_string(n.targets.size()) + " loop variables");
      for (std::size_t k = 0; k < parts.size(); ++k) assign(n.targets[k], parts[k]);
    };
    if (n.cond) {  // the filter sees the loop variables, and loop.* counts the kept items
      std::vector<Value> kept;
      scopes_.emplace_back();
      for (const Value& it : items) {
        bind(it);
        if (truthy(eval(*n.cond))) kept.push_back(it);
      }
      scopes_.pop_back();
      items = std::move(kept);
    }
    if (items.empty()) {
      run(n.else_body, out);
      return;
    }
    const auto len = static_cast<std::int64_t>(items.size());
    for (std::int64_t k = 0; k < len; ++k) {
      scopes_.emplace_back();
      Value lp = Value::make_dict();
      lp.set("index0", Value::integer(k));
      lp.set("index", Value::integer(k + 1));
      lp.set("revindex0", Value::integer(len - k - 1));
      lp.set("revindex", Value::integer(len - k));
      lp.set("first", Value::boolean(k == 0));
      lp.set("last", Value::boolean(k == len - 1));
      lp.set("length", Value::integer(len));
      if (k > 0) lp.set("previtem", items[static_cast<std::size_t>(k - 1)]);
      if (k + 1 < len) lp.set("nextitem", items[static_cast<std::size_t>(k + 1)]);
      assign("loop", lp);
      bind(items[static_cast<std::size_t>(k)]);
      bool stop = false;
      try {
        run(n.body, out);
      } catch (const BreakSignal&) {
        stop = true;
      } catch (const ContinueSignal&) {
      }
      scopes_.pop_back();
      if (stop) break;
    }
  }

  Value attribute(const Expr& e, const Value& obj, const std::string& name) {
    switch (obj.kind) {
      case K::undefined: fail(e, "'" + name + "' of an undefined value");
      case K::dict: return obj.get(name);
      case K::list:
        if (!name.empty() && std::isdigit(static_cast<unsigned char>(name[0]))) {
          std::size_t k = 0;
          const auto r = std::from_chars(name.data(), name.data() + name.size(), k);
          return r.ec == std::errc() && k < obj.list->size() ? (*obj.list)[k] : Value{};
        }
        return {};
      default: return {};
    }
  }

  Value subscript(const Expr& e, const Value& obj, const Value& key) {
    switch (obj.kind) {
      case K::undefined: fail(e, "a subscript of an undefined value");
      case K::dict:
        if (key.kind != K::string) return {};
        return obj.get(key.s);
      case K::list:
      case K::string: {
        if (key.kind != K::integer) {
          if (key.kind == K::string) return {};
          fail(e, "a " + type_name(obj) + " index must be an integer");
        }
        const std::vector<std::string> cps = obj.kind == K::string ? code_points(obj.s) : std::vector<std::string>{};
        const auto n = static_cast<std::int64_t>(obj.kind == K::string ? cps.size() : obj.list->size());
        std::int64_t k = key.i < 0 ? key.i + n : key.i;
        if (k < 0 || k >= n) return {};
        return obj.kind == K::string ? Value::str(cps[static_cast<std::size_t>(k)]) : (*obj.list)[static_cast<std::size_t>(k)];
      }
      default: return {};
    }
  }

  Value slice(const Expr& e) {
    const Value obj = eval(*e.kids[0]);
    if (obj.kind != K::list && obj.kind != K::string) fail(e, "slicing a " + type_name(obj));
    const auto opt = [&](const ExprP& p) -> std::optional<std::int64_t> {
      if (!p) return std::nullopt;
      const Value v = eval(*p);
      if (v.kind == K::none) return std::nullopt;
      if (v.kind != K::integer) fail(e, "slice bounds must be integers");
      return v.i;
    };
    const std::vector<std::string> cps = obj.kind == K::string ? code_points(obj.s) : std::vector<std::string>{};
    const auto n = static_cast<std::int64_t>(obj.kind == K::string ? cps.size() : obj.list->size());
    std::int64_t step = opt(e.kids[3]).value_or(1);
    if (step == 0) fail(e, "a slice step of zero");
    step = std::clamp<std::int64_t>(step, -(n + 1), n + 1);  // a longer step takes one item all the same
    const auto norm = [&](std::optional<std::int64_t> v, std::int64_t dflt) {
      if (!v) return dflt;
      std::int64_t x = *v < 0 ? *v + n : *v;
      return step > 0 ? std::clamp<std::int64_t>(x, 0, n) : std::clamp<std::int64_t>(x, -1, n - 1);
    };
    const std::int64_t a = norm(opt(e.kids[1]), step > 0 ? 0 : n - 1), b = norm(opt(e.kids[2]), step > 0 ? n : -1);
    std::vector<Value> out;
    std::string s;
    for (std::int64_t k = a; step > 0 ? k < b : k > b; k += step) {
      if (obj.kind == K::string)
        s += cps[static_cast<std::size_t>(k)];
      else
        out.push_back((*obj.list)[static_cast<std::size_t>(k)]);
    }
    return obj.kind == K::string ? Value::str(s) : Value::make_list(std::move(out));
  }

  Value arith(const Expr& e, const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return Value::str(to_str(a) + to_str(b));
    if (op == "+") {
      if (a.kind == K::string && b.kind == K::string) return Value::str(a.s + b.s);
      if (a.kind == K::list && b.kind == K::list) {
        std::vector<Value> l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::make_list(std::move(l));
      }
    }
    if (op == "*" && ((a.kind == K::string && b.kind == K::integer) || (a.kind == K::integer && b.kind == K::string))) {
      const std::string& s = a.kind == K::string ? a.s : b.s;
      const std::int64_t times = a.kind == K::integer ? a.i : b.i;
      if (times > 0 && s.size() * static_cast<std::size_t>(times) > (std::size_t{1} << 24))
        fail(e, "a string repeated past 16 MiB");
      std::string r;
      for (std::int64_t k = 0; k < times; ++k) r += s;
      return Value::str(r);
    }
    if (!numeric(a) || !numeric(b))
      fail(e, "'" + op + "' between " + type_name(a) + " and " + type_name(b));
    const bool ints = a.kind != K::number && b.kind != K::number;
    if (op == "/") {
      if (as_double(b) == 0) fail(e, "division by zero");
      return Value::number(as_double(a) / as_double(b));
    }
    if (ints) {
      const std::int64_t x = as_int(a), y = as_int(b);
      std::int64_t r = 0;
      const auto overflow = [&]() { fail(e, "'" + op + "' overflows a 64-bit integer"); };
      if (op == "+") return __builtin_add_overflow(x, y, &r) ? overflow(), Value{} : Value::integer(r);
      if (op == "-") return __builtin_sub_overflow(x, y, &r) ? overflow(), Value{} : Value::integer(r);
      if (op == "*") return __builtin_mul_overflow(x, y, &r) ? overflow(), Value{} : Value::integer(r);
      if (op == "**") {
        if (y < 0) return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
        if (x == 0 || x == 1) return Value::integer(y == 0 ? 1 : x);
        if (x == -1) return Value::integer(y % 2 ? -1 : 1);
        r = 1;
        for (std::int64_t k = 0; k < y; ++k)  // |x| >= 2: overflows within 63 steps
          if (__builtin_mul_overflow(r, x, &r)) overflow();
        return Value::integer(r);
      }
      if (y == 0) fail(e, "division by zero");
      if (x == INT64_MIN && y == -1) overflow();
      std::int64_t q = x / y;
      r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    const double x = as_double(a), y = as_double(b);
    if (op == "+") return Value::number(x + y);
    if (op == "-") return Value::number(x - y);
    if (op == "*") return Value::number(x * y);
    if (op == "**") return Value::number(std::pow(x, y));
    if (y == 0) fail(e, "division by zero");
    const double q = std::floor(x / y);
    return Value::number(op == "//" ? q : x - q * y);
  }

  // Positional and keyword arguments, evaluated.
  struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    Value kwarg(const std::string& name, std::size_t pos_index, Value dflt = {}) const {
      for (const auto& [k, v] : kw)
        if (k == name) return v;
      return pos_index < pos.size() ? pos[pos_index] : dflt;
    }
  };
  Args eval_args(const std::vector<Arg>& args) {
    Args a;
    for (const Arg& x : args) {
      if (x.name.empty())
        a.pos.push_back(eval(*x.value));
      else
        a.kw.emplace_back(x.name, eval(*x.value));
    }
    return a;
  }

  bool test(const Expr& e, const std::string& name, const Value& v, const Args& a) {
    const auto arg = [&]() -> Value {
      if (a.pos.empty()) fail(e, "the test '" + name + "' needs an argument");
      return a.pos[0];
    };
    if (name == "defined") return v.defined();
    if (name == "undefined") return !v.defined();
    if (name == "none") return v.kind == K::none;
    if (name == "string") return v.kind == K::string;
    if (name == "number") return v.kind == K::integer || v.kind == K::number;
    if (name == "integer") return v.kind == K::integer;
    if (name == "float") return v.kind == K::number;
    if (name == "boolean") return v.kind == K::boolean;
    if (name == "mapping") return v.kind == K::dict;
    if (name == "iterable") return v.kind == K::list || v.kind == K::dict || v.kind == K::string;
    if (name == "sequence") return v.kind == K::list || v.kind == K::dict || v.kind == K::string;
    if (name == "true") return v.kind == K::boolean && v.b;
    if (name == "false") return v.kind == K::boolean && !v.b;
    if (name == "callable") return false;
    if (name == "even" || name == "odd") {
      if (v.kind != K::integer) fail(e, "'is " + name + "' of a " + type_name(v));
      return (((v.i % 2) + 2) % 2 == 0) == (name == "even");
    }
    if (name == "divisibleby") {
      const Value d = arg();
      if (v.kind != K::integer || d.kind != K::integer || d.i == 0) fail(e, "'is divisibleby' needs integers");
      return d.i == -1 || v.i % d.i == 0;
    }
    if (name == "eq" || name == "equalto" || name == "==") return equal(v, arg());
    if (name == "ne" || name == "!=") return !equal(v, arg());
    if (name == "sameas") {
      const Value o = arg();
      if (v.kind != o.kind) return false;
      if (v.kind == K::none || v.kind == K::undefined) return true;
      if (v.kind == K::boolean) return v.b == o.b;
      if (v.kind == K::list) return v.list == o.list;
      if (v.kind == K::dict) return v.dict == o.dict;
      return false;
    }
    if (name == "lt" || name == "lessthan") return compare(v, arg()) < 0;
    if (name == "gt" || name == "greaterthan") return compare(v, arg()) > 0;
    if (name == "le") return compare(v, arg()) <= 0;
    if (name == "ge") return compare(v, arg()) >= 0;
    if (name == "in") return contains(arg(), v);
    fail(e, "the test " + name);
  }

  Value filter(const Expr& e, const std::string& name, const Value& v, const Args& a) {
    const auto need_str = [&]() -> const std::string& {
      if (v.kind != K::string) fail(e, "|" + name + " of a " + type_name(v));
      return v.s;
    };
    if (name == "safe") return v;
    if (name == "e" || name == "escape") {
      std::string o;
      for (char c : to_str(v)) {
        switch (c) {
          case '&': o += "&amp;"; break;
          case '<': o += "&lt;"; break;
          case '>': o += "&gt;"; break;
          case '"': o += "&#34;"; break;
          case '\'': o += "&#39;"; break;
          default: o += c;
        }
      }
      return Value::str(o);
    }
    if (name == "trim") {
      const Value chars = a.kwarg("chars", 0);
      return Value::str(py_strip(need_str(), true, true, chars.kind == K::string ? &chars.s : nullptr));
    }
    if (name == "length" || name == "count") {
      switch (v.kind) {
        case K::string: return Value::integer(static_cast<std::int64_t>(code_points(v.s).size()));
        case K::list: return Value::integer(static_cast<std::int64_t>(v.list->size()));
        case K::dict: return Value::integer(static_cast<std::int64_t>(v.dict->size()));
        case K::undefined: return Value::integer(0);
        default: fail(e, "|" + name + " of a " + type_name(v));
      }
    }
    if (name == "tojson") {
      const Value ind = a.kwarg("indent", 0);
      if (ind.defined() && ind.kind != K::none && ind.kind != K::integer) fail(e, "|tojson's indent must be an integer");
      for (const auto& [k, x] : a.kw)
        if (k != "indent") fail(e, "|tojson(" + k + "=…) is not supported");
      std::string o;
      to_json(o, v, ind.kind == K::integer ? static_cast<int>(ind.i) : -1, 0);
      return Value::str(o);
    }
    if (name == "upper" || name == "lower") {
      std::string s = need_str();
      for (char& c : s) c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
      return Value::str(s);
    }
    if (name == "capitalize" || name == "title") return method(e, name, v, Args{});
    if (name == "default" || name == "d") {
      const Value dflt = a.kwarg("default_value", 0, Value::str(""));
      const bool boolean = truthy(a.kwarg("boolean", 1, Value::boolean(false)));
      return (boolean ? truthy(v) : v.defined()) ? v : dflt;
    }
    if (name == "first" || name == "last") {
      const std::vector<Value> it = iterate(v);
      if (it.empty()) return {};
      return name == "first" ? it.front() : it.back();
    }
    if (name == "join") {
      const Value sep = a.kwarg("d", 0, Value::str(""));
      const Value attr = a.kwarg("attribute", 1);
      std::string o;
      bool first = true;
      for (const Value& x : iterate(v)) {
        o += (first ? "" : to_str(sep)) + to_str(attr.defined() ? attribute(e, x, to_str(attr)) : x);
        first = false;
      }
      return Value::str(o);
    }
    if (name == "list") return Value::make_list(iterate(v));
    if (name == "string") return Value::str(to_str(v));
    if (name == "int") {
      if (numeric(v)) return Value::integer(as_int(v));
      if (v.kind == K::string) {
        try {
          return Value::integer(std::stoll(py_strip(v.s, true, true)));
        } catch (const std::exception&) {
        }
      }
      return a.kwarg("default", 0, Value::integer(0));
    }
    if (name == "float") {
      if (numeric(v)) return Value::number(as_double(v));
      if (v.kind == K::string) {
        try {
          return Value::number(std::stod(py_strip(v.s, true, true)));
        } catch (const std::exception&) {
        }
      }
      return a.kwarg("default", 0, Value::number(0));
    }
    if (name == "abs") {
      if (v.kind == K::integer && v.i != INT64_MIN) return Value::integer(v.i < 0 ? -v.i : v.i);
      if (v.kind == K::number) return Value::number(std::fabs(v.d));
      fail(e, "|abs of a " + type_name(v));
    }
    if (name == "round") {
      const Value prec = a.kwarg("precision", 0, Value::integer(0));
      if (!numeric(v)) fail(e, "|round of a " + type_name(v));
      const double f = std::pow(10.0, static_cast<double>(as_int(prec)));
      return Value::number(std::nearbyint(as_double(v) * f) / f);
    }
    if (name == "replace") return method(e, "replace", v, a);
    if (name == "reverse") {
      if (v.kind == K::string) {
        std::vector<std::string> cps = code_points(v.s);
        std::string o;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) o += *it;
        return Value::str(o);
      }
      std::vector<Value> it = iterate(v);
      std::reverse(it.begin(), it.end());
      return Value::make_list(std::move(it));
    }
    if (name == "sort" || name == "unique") {
      std::vector<Value> it = iterate(v);
      if (name == "unique") {
        std::vector<Value> u;
        for (const Value& x : it)
          if (std::none_of(u.begin(), u.end(), [&](const Value& y) { return equal(x, y); })) u.push_back(x);
        return Value::make_list(std::move(u));
      }
      const bool rev = truthy(a.kwarg("reverse", 0));
      const Value attr = a.kwarg("attribute", 2);
      std::stable_sort(it.begin(), it.end(), [&](const Value& x, const Value& y) {
        const Value kx = attr.defined() ? attribute(e, x, to_str(attr)) : x;
        const Value ky = attr.defined() ? attribute(e, y, to_str(attr)) : y;
        return rev ? compare(ky, kx) < 0 : compare(kx, ky) < 0;
      });
      return Value::make_list(std::move(it));
    }
    if (name == "items") {
      if (v.kind == K::undefined) return Value::make_list();
      if (v.kind != K::dict) fail(e, "|items of a " + type_name(v));
      return dict_items(v);
    }
    if (name == "dictsort") {
      if (v.kind != K::dict) fail(e, "|dictsort of a " + type_name(v));
      std::vector<Value> it = *dict_items(v).list;
      std::stable_sort(it.begin(), it.end(),
                       [&](const Value& x, const Value& y) { return compare((*x.list)[0], (*y.list)[0]) < 0; });
      return Value::make_list(std::move(it));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name.size() > 6;
      const bool keep_true = name[0] == 's';
      std::vector<Value> out;
      const std::size_t first = by_attr ? 1 : 0;
      const std::string tname = a.pos.size() > first ? to_str(a.pos[first]) : "";
      if (!tname.empty() && !kTests.count(tname)) fail(e, "|" + name + " with the test '" + tname + "'");
      Args targs;
      targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(std::min(a.pos.size(), first + 1)), a.pos.end());
      for (const Value& x : iterate(v)) {
        const Value subject = by_attr ? attribute(e, x, a.pos.empty() ? "" : to_str(a.pos[0])) : x;
        const bool r = tname.empty() ? truthy(subject) : test(e, tname, subject, targs);
        if (r == keep_true) out.push_back(x);
      }
      return Value::make_list(std::move(out));
    }
    if (name == "map") {
      const Value attr = a.kwarg("attribute", 99);
      std::vector<Value> out;
      if (attr.defined()) {
        const Value dflt = a.kwarg("default", 99);
        for (const Value& x : iterate(v)) {
          Value y = attribute(e, x, to_str(attr));
          out.push_back(y.defined() || !dflt.defined() ? y : dflt);
        }
      } else {
        if (a.pos.empty()) fail(e, "|map needs a filter name or attribute=");
        const std::string f = to_str(a.pos[0]);
        if (!kFilters.count(f) || f == "map") fail(e, "|map with the filter " + f);
        Args fa;
        fa.pos.assign(a.pos.begin() + 1, a.pos.end());
        fa.kw = a.kw;
        for (const Value& x : iterate(v)) out.push_back(filter(e, f, x, fa));
      }
      return Value::make_list(std::move(out));
    }
    if (name == "wordcount") {
      std::int64_t n = 0;
      bool in_word = false;
      for (char c : need_str()) {
        const bool w = !std::isspace(static_cast<unsigned char>(c));
        if (w && !in_word) ++n;
        in_word = w;
      }
      return Value::integer(n);
    }
    if (name == "sum") {
      Value s = a.kwarg("start", 1, Value::integer(0));
      for (const Value& x : iterate(v)) s = arith(e, "+", s, x);
      return s;
    }
    if (name == "min" || name == "max") {
      const std::vector<Value> it = iterate(v);
      if (it.empty()) return {};
      Value best = it[0];
      for (const Value& x : it)
        if ((name == "min") ? compare(x, best) < 0 : compare(x, best) > 0) best = x;
      return best;
    }
    fail(e, "the filter " + name);
  }

  static std::vector<std::string> split(const std::string& s, const Value& sep, std::int64_t maxsplit, bool from_right) {
    std::vector<std::string> parts;
    if (sep.kind == K::string) {
      if (sep.s.empty()) throw RenderError("split() with an empty separator");
      if (!from_right) {
        std::size_t p = 0;
        while (true) {
          const std::size_t q = s.find(sep.s, p);
          if (q == std::string::npos || (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) >= maxsplit)) {
            parts.push_back(s.substr(p));
            break;
          }
          parts.push_back(s.substr(p, q - p));
          p = q + sep.s.size();
        }
      } else {
        std::size_t end = s.size();
        while (true) {
          const std::size_t q = end >= sep.s.size() ? s.rfind(sep.s, end - sep.s.size()) : std::string::npos;
          if (q == std::string::npos || (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) >= maxsplit)) {
            parts.insert(parts.begin(), s.substr(0, end));
            break;
          }
          parts.insert(parts.begin(), s.substr(q + sep.s.size(), end - q - sep.s.size()));
          end = q;
        }
      }
      return parts;
    }
    // Runs of whitespace; none at the ends.
    const std::vector<std::string> cps = code_points(s);
    std::string cur;
    bool in = false;
    for (const std::string& c : cps) {
      if (py_space(decode_cp(c))) {
        if (in) parts.push_back(cur), cur.clear(), in = false;
      } else {
        cur += c;
        in = true;
      }
    }
    if (in) parts.push_back(cur);
    return parts;
  }

  Value method(const Expr& e, const std::string& name, const Value& obj, const Args& a) {
    if (obj.kind == K::string) {
      const std::string& s = obj.s;
      const auto sarg = [&](std::size_t k) -> const Value& {
        static const Value none;
        return k < a.pos.size() ? a.pos[k] : none;
      };
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value c = sarg(0);
        return Value::str(py_strip(s, name != "rstrip", name != "lstrip", c.kind == K::string ? &c.s : nullptr));
      }
      if (name == "startswith" || name == "endswith") {
        std::vector<Value> opts = sarg(0).kind == K::list ? *sarg(0).list : std::vector<Value>{sarg(0)};
        for (const Value& o : opts) {
          if (o.kind != K::string) fail(e, "." + name + "() needs a string");
          if (name == "startswith" ? s.rfind(o.s, 0) == 0
                                   : (s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0))
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "split" || name == "rsplit") {
        const Value sep = a.kwarg("sep", 0);
        const Value mx = a.kwarg("maxsplit", 1, Value::integer(-1));
        std::vector<Value> out;
        for (auto& p : split(s, sep.kind == K::none ? Value{} : sep, mx.kind == K::integer ? mx.i : -1, name == "rsplit"))
          out.push_back(Value::str(p));
        return Value::make_list(std::move(out));
      }
      if (name == "splitlines") {
        std::vector<Value> out;
        std::size_t p = 0;
        while (p < s.size()) {
          std::size_t q = s.find_first_of("\r\n", p);
          if (q == std::string::npos) {
            out.push_back(Value::str(s.substr(p)));
            break;
          }
          out.push_back(Value::str(s.substr(p, q - p)));
          p = q + (s[q] == '\r' && q + 1 < s.size() && s[q + 1] == '\n' ? 2 : 1);
        }
        return Value::make_list(std::move(out));
      }
      if (name == "upper" || name == "lower") return filter(e, name, obj, Args{});
      if (name == "capitalize" || name == "title") {
        std::string o = s;
        bool start = true;
        for (char& c : o) {
          const auto u = static_cast<unsigned char>(c);
          if (name == "capitalize") {
            c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
            start = false;
          } else {
            c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
            start = !std::isalpha(u);
          }
        }
        return Value::str(o);
      }
      if (name == "replace") {
        const Value from = sarg(0), to = sarg(1);
        if (from.kind != K::string || to.kind != K::string) fail(e, ".replace() needs two strings");
        std::int64_t count = sarg(2).kind == K::integer ? sarg(2).i : -1;
        std::string o;
        std::size_t p = 0;
        if (from.s.empty()) return Value::str(s);
        while (count != 0) {
          const std::size_t q = s.find(from.s, p);
          if (q == std::string::npos) break;
          o += s.substr(p, q - p) + to.s;
          p = q + from.s.size();
          --count;
        }
        return Value::str(o + s.substr(p));
      }
      if (name == "find") {
        if (sarg(0).kind != K::string) fail(e, ".find() needs a string");
        const std::size_t q = s.find(sarg(0).s);
        return Value::integer(q == std::string::npos ? -1 : static_cast<std::int64_t>(code_points(s.substr(0, q)).size()));
      }
      if (name == "count") {
        if (sarg(0).kind != K::string || sarg(0).s.empty()) fail(e, ".count() needs a non-empty string");
        std::int64_t n = 0;
        for (std::size_t q = s.find(sarg(0).s); q != std::string::npos; q = s.find(sarg(0).s, q + sarg(0).s.size())) ++n;
        return Value::integer(n);
      }
      if (name == "join") {
        std::string o;
        bool first = true;
        for (const Value& x : iterate(sarg(0))) {
          if (x.kind != K::string) fail(e, ".join() of a non-string");
          o += (first ? "" : s) + x.s;
          first = false;
        }
        return Value::str(o);
      }
    }
    if (obj.kind == K::dict) {
      if (name == "items") return dict_items(obj);
      if (name == "keys" || name == "values") {
        std::vector<Value> out;
        for (const auto& [k, x] : *obj.dict) out.push_back(name == "keys" ? Value::str(k) : x);
        return Value::make_list(std::move(out));
      }
      if (name == "get") {
        if (a.pos.empty() || a.pos[0].kind != K::string) fail(e, ".get() needs a string key");
        const Value v = obj.get(a.pos[0].s);
        return v.defined() ? v : (a.pos.size() > 1 ? a.pos[1] : Value::none());
      }
    }
    if (obj.kind == K::list) {
      if (name == "index" || name == "count") {
        if (a.pos.empty()) fail(e, "." + name + "() needs an argument");
        std::int64_t n = 0;
        for (std::size_t k = 0; k < obj.list->size(); ++k)
          if (equal((*obj.list)[k], a.pos[0])) {
            if (name == "index") return Value::integer(static_cast<std::int64_t>(k));
            ++n;
          }
        if (name == "index") fail(e, ".index(): the value is not in the list");
        return Value::integer(n);
      }
    }
    fail(e, "a " + type_name(obj) + " has no method ." + name + "()");
  }

  Value function(const Expr& e, const Args& a) {
    const std::string& f = e.name;
    if (f == "raise_exception") {
      throw RenderError("the chat template raised an error: " + (a.pos.empty() ? std::string() : to_str(a.pos[0])));
    }
    if (f == "namespace" || f == "dict") {
      Value d = Value::make_dict();
      d.is_namespace = f == "namespace";
      for (const Value& p : a.pos)
        if (p.kind == K::dict)
          for (const auto& [k, x] : *p.dict) d.set(k, x);
      for (const auto& [k, x] : a.kw) d.set(k, x);
      return d;
    }
    if (f == "range") {
      std::int64_t start = 0, stop = 0, step = 1;
      for (const Value& p : a.pos)
        if (p.kind != K::integer) fail(e, "range() needs integers");
      if (a.pos.size() == 1) stop = a.pos[0].i;
      else if (a.pos.size() >= 2) start = a.pos[0].i, stop = a.pos[1].i;
      if (a.pos.size() == 3) step = a.pos[2].i;
      if (a.pos.empty() || a.pos.size() > 3 || step == 0) fail(e, "range() takes 1 to 3 integers, a step other than 0");
      std::vector<Value> out;
      for (std::int64_t k = start; step > 0 ? k < stop : k > stop;) {
        out.push_back(Value::integer(k));
        if (out.size() > 1'000'000) fail(e, "range() of more than a million items");
        // The distance left, in unsigned arithmetic: no overflow near the 64-bit ends.
        const std::uint64_t left = step > 0 ? static_cast<std::uint64_t>(stop) - static_cast<std::uint64_t>(k)
                                            : static_cast<std::uint64_t>(k) - static_cast<std::uint64_t>(stop);
        const std::uint64_t stride = step > 0 ? static_cast<std::uint64_t>(step) : 0 - static_cast<std::uint64_t>(step);
        if (left <= stride) break;
        k = static_cast<std::int64_t>(static_cast<std::uint64_t>(k) + (step > 0 ? stride : 0 - stride));
      }
      return Value::make_list(std::move(out));
    }
    if (f == "strftime_now") {
      if (a.pos.empty() || a.pos[0].kind != K::string) fail(e, "strftime_now() needs a format string");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const std::size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
      return Value::str(std::string(buf, n));
    }
    fail(e, "the function " + f);
  }

  Value eval(const Expr& e) {
    switch (e.type) {
      case Expr::literal: return e.lit;
      case Expr::var: return lookup(e.name);
      case Expr::attr: return attribute(e, eval(*e.kids[0]), e.name);
      case Expr::index: return subscript(e, eval(*e.kids[0]), eval(*e.kids[1]));
      case Expr::slice: return slice(e);
      case Expr::call: {
        const Args a = eval_args(e.args);
        if (e.kids.empty()) return function(e, a);
        return method(e, e.name, eval(*e.kids[0]), a);
      }
      case Expr::filter: return filter(e, e.name, eval(*e.kids[0]), eval_args(e.args));
      case Expr::test: return Value::boolean(test(e, e.name, eval(*e.kids[0]), eval_args(e.args)) != e.negate);
      case Expr::unary: {
        const Value v = eval(*e.kids[0]);
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (v.kind == K::integer) {
          if (e.name == "-" && v.i == INT64_MIN) fail(e, "unary - overflows a 64-bit integer");
          return Value::integer(e.name == "-" ? -v.i : v.i);
        }
        if (v.kind == K::number) return Value::number(e.name == "-" ? -v.d : v.d);
        fail(e, "unary " + e.name + " of a " + type_name(v));
      }
      case Expr::binary: {
        const Value a = eval(*e.kids[0]), b = eval(*e.kids[1]);
        const std::string& op = e.name;
        if (op == "==") return Value::boolean(equal(a, b));
        if (op == "!=") return Value::boolean(!equal(a, b));
        if (op == "in") return Value::boolean(contains(b, a));
        if (op == "not in") return Value::boolean(!contains(b, a));
        if (op == "<" || op == "<=" || op == ">" || op == ">=") {
          int c;
          try {
            c = compare(a, b);
          } catch (const RenderError& x) {
            fail(e, x.what());
          }
          return Value::boolean(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
        }
        return arith(e, op, a, b);
      }
      case Expr::logic: {
        Value a = eval(*e.kids[0]);
        if (e.name == "and") return truthy(a) ? eval(*e.kids[1]) : a;
        return truthy(a) ? a : eval(*e.kids[1]);
      }
      case Expr::ternary:
        if (truthy(eval(*e.kids[0]))) return eval(*e.kids[1]);
        return e.kids[2] ? eval(*e.kids[2]) : Value{};
      case Expr::list: {
        std::vector<Value> l;
        for (const auto& k : e.kids) l.push_back(eval(*k));
        return Value::make_list(std::move(l));
      }
      case Expr::dict: {
        Value d = Value::make_dict();
        for (std::size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          const Value key = eval(*e.kids[k]);
          if (key.kind != K::string) fail(e, "dict keys must be strings");
          d.set(key.s, eval(*e.kids[k + 1]));
        }
        return d;
      }
    }
    return {};
  }

  std::vector<Scope> scopes_;
};

}  // namespace

std::shared_ptr<const Template> compile(std::string_view text, const std::string& what) {
  auto t = std::make_shared<Template>();
  t->body = Parser(Lexer(text, what).run(), what).parse();
  return t;
}

std::string render(const Template& t, const Value& context) {
  std::string out;
  Renderer r(context);
  try {
    r.run(t.body, out);
  } catch (const BreakSignal&) {
    throw RenderError("{% break %} outside a loop");
  } catch (const ContinueSignal&) {
    throw RenderError("{% continue %} outside a loop");
  }
  return out;
}

}  // namespace zinf::jinja
