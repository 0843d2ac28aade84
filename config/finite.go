package config

import (
	"fmt"
	"math"
	"reflect"
	"strings"
)

// checkFinite returns an error naming the first key whose value is NaN or
// an infinity. TOML writes both (nan, inf), and a range check such as
// "x < 0" lets NaN through, so no number of the configuration may be
// either; a key that wants "no limit" says so with 0.
func checkFinite(v reflect.Value, key string) error {
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		if x := v.Float(); math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("%s = %v: must be a finite number", key, x)
		}
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return checkFinite(v.Elem(), key)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			if key != "" {
				name = key + "." + name
			}
			if err := checkFinite(v.Field(i), name); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if err := checkFinite(v.Index(i), fmt.Sprintf("%s[%d]", key, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			if err := checkFinite(v.MapIndex(k), fmt.Sprintf("%s.%v", key, k)); err != nil {
				return err
			}
		}
	}
	return nil
}
