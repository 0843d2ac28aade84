package docgen

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// item is a value found by following steps, with the names of the array
// entries it lies in.
type item struct {
	label string
	v     reflect.Value
}

// follow returns the values steps lead to from v: one, none (a nil table
// on the way) or one per array entry. With templates, an array's entries
// are its template alone (the default column).
func follow(v reflect.Value, steps []step, templates map[string]any) (items []item, entries int) {
	cur := []item{{"", v}}
	entries = -1
	for _, s := range steps {
		var next []item
		for _, it := range cur {
			x := it.v
			for x.Kind() == reflect.Pointer || x.Kind() == reflect.Interface {
				if x.IsNil() {
					break
				}
				x = x.Elem()
			}
			if x.Kind() == reflect.Pointer || x.Kind() == reflect.Interface {
				continue // a nil table: it has no keys here
			}
			if !s.each {
				next = append(next, item{it.label, x.Field(s.field)})
				continue
			}
			if templates != nil {
				if t, ok := templates[s.array]; ok {
					next = append(next, item{it.label, reflect.ValueOf(t)})
				}
				continue
			}
			for i := range x.Len() {
				next = append(next, item{joinLabel(it.label, entryLabel(x.Index(i), i)), x.Index(i)})
			}
		}
		cur = next
		if s.each {
			entries = len(cur)
		}
	}
	return cur, entries
}

func joinLabel(a, b string) string {
	if a == "" {
		return b
	}
	return a + "/" + b
}

// entryLabel names an entry of an array of tables by its "name" key, else
// its position.
func entryLabel(v reflect.Value, i int) string {
	for v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		for j := range v.NumField() {
			f := v.Type().Field(j)
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if name == "name" && f.Type.Kind() == reflect.String && v.Field(j).String() != "" {
				return v.Field(j).String()
			}
		}
	}
	return "#" + strconv.Itoa(i+1)
}

// cell renders the values of one key in one column.
func cell(items []item, entries int, template bool) string {
	if len(items) == 0 {
		return "—"
	}
	if entries < 0 || template {
		return code(literal(items[0].v))
	}
	type group struct {
		value  string
		labels []string
	}
	var groups []*group
	for _, it := range items {
		s := literal(it.v)
		i := slices.IndexFunc(groups, func(g *group) bool { return g.value == s })
		if i < 0 {
			groups = append(groups, &group{value: s})
			i = len(groups) - 1
		}
		groups[i].labels = append(groups[i].labels, it.label)
	}
	var parts []string
	for _, g := range groups {
		who := strings.Join(g.labels, ", ")
		switch {
		case len(g.labels) == entries && entries > 1:
			who = fmt.Sprintf("all %d", entries)
		case len(g.labels) == 1 && g.value == strconv.Quote(g.labels[0]):
			parts = append(parts, code(g.value)) // the entry's name itself
			continue
		}
		parts = append(parts, code(g.value)+" ("+escape(who)+")")
	}
	return strings.Join(parts, "<br>")
}

// literal writes a value as TOML would (durations as the strings recal's
// files use).
func literal(v reflect.Value) string {
	if v.Type() == durationType {
		return strconv.Quote(durationText(time.Duration(v.Int())))
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return "unset"
		}
		return literal(v.Elem())
	case reflect.String:
		return strconv.Quote(v.String())
	case reflect.Bool:
		return strconv.FormatBool(v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(v.Uint(), 10)
	case reflect.Float32, reflect.Float64:
		s := strconv.FormatFloat(v.Float(), 'g', -1, 64)
		if !strings.ContainsAny(s, ".eIN") {
			s += ".0"
		}
		return s
	case reflect.Slice, reflect.Array:
		var parts []string
		for i := range v.Len() {
			e := v.Index(i)
			if isTable(e.Type()) {
				parts = append(parts, strconv.Quote(entryLabel(e, i)))
			} else {
				parts = append(parts, literal(e))
			}
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case reflect.Map:
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
		if len(keys) == 0 {
			return "{}"
		}
		var parts []string
		for _, k := range keys {
			parts = append(parts, bareKey(k.String())+" = "+literal(v.MapIndex(k)))
		}
		return "{ " + strings.Join(parts, ", ") + " }"
	case reflect.Struct:
		return "{…}"
	}
	return fmt.Sprint(v.Interface())
}

// bareKey quotes a TOML key unless it may stand bare.
func bareKey(k string) string {
	if k == "" || strings.ContainsFunc(k, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
	}) {
		return strconv.Quote(k)
	}
	return k
}

// durationText writes d as recal's files do: "300s", "500ms".
func durationText(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	case d%time.Millisecond == 0:
		return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
	}
	return d.String()
}
