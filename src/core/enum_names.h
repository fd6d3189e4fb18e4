// Enums spelled as text (the config's policies: parallel.schedule, comm.compress, ...). Each such enum E has one
// table of (value, "name") pairs, returned by an `enum_names(E)` overload declared beside E; name_of and
// parse_name below read that table, so a spelling is written once. Header-only: the fuzz targets link only the
// config sources.
#pragma once
#include <cstddef>
#include <string>

namespace mt {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The name of `e` in `table` ("?" for a value the table lacks).
template <typename E, size_t N>
const char* enum_name(const EnumName<E> (&table)[N], E e) {
  for (const EnumName<E>& n : table)
    if (n.value == e) return n.name;
  return "?";
}

// Sets `out` to the value named `name` in `table`; false (and `out` unchanged) when no entry has that name.
template <typename E, size_t N>
bool enum_from_name(const EnumName<E> (&table)[N], const std::string& name, E& out) {
  for (const EnumName<E>& n : table)
    if (name == n.name) return out = n.value, true;
  return false;
}

// The names of `table` in order, joined by ", " ("1f1b, gpipe, interleaved, zb1"): the list error messages give.
template <typename E, size_t N>
std::string enum_choices(const EnumName<E> (&table)[N]) {
  std::string s;
  for (const EnumName<E>& n : table) s += (s.empty() ? "" : ", ") + std::string(n.name);
  return s;
}

// For an enum with an enum_names overload (found by argument-dependent lookup).
template <typename E, typename = decltype(enum_names(E{}))>
const char* name_of(E e) {
  return enum_name(enum_names(e), e);
}
template <typename E, typename = decltype(enum_names(E{}))>
bool parse_name(const std::string& name, E& out) {
  return enum_from_name(enum_names(out), name, out);
}

}  // namespace mt
