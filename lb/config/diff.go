package config

import (
	"fmt"
	"reflect"
	"strings"

	"pdlb/internal/yamlkeys"
)

// Diff names the first setting that differs between a and b by its path
// in the config file ("upstream.retries") and the two values, "" when
// they are equal: what a reload that must not change it says.
func Diff(a, b Config) string {
	path, va, vb := diff(reflect.ValueOf(a), reflect.ValueOf(b), "")
	if path == "" {
		return ""
	}
	// A list of models or pods holds their pods' API keys (PodKey).
	if !va.IsValid() || secret(path) || path == "models" || path == "pods" {
		return path
	}
	return fmt.Sprintf("%s: %s → %s", path, short(va), short(vb))
}

// diff walks a and b, of one type, field by field in declaration order;
// the values are invalid when what differs is not a setting of its own
// (an unexported field under path).
func diff(a, b reflect.Value, path string) (string, reflect.Value, reflect.Value) {
	if a.Kind() != reflect.Struct {
		if reflect.DeepEqual(a.Interface(), b.Interface()) {
			return "", reflect.Value{}, reflect.Value{}
		}
		return path, a, b
	}
	t := a.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		sub := path
		switch {
		case name == "" && f.Tag.Get("yaml") != "":
			// Inline: its keys are its parent's.
		case name == "":
			sub = yamlkeys.Join(path, strings.ToLower(f.Name))
		default:
			sub = yamlkeys.Join(path, name)
		}
		if p, va, vb := diff(a.Field(i), b.Field(i), sub); p != "" {
			return p, va, vb
		}
	}
	if !reflect.DeepEqual(a.Interface(), b.Interface()) {
		return path, reflect.Value{}, reflect.Value{}
	}
	return "", reflect.Value{}, reflect.Value{}
}

// secret says the setting at path holds credentials, whose values are
// not printed.
func secret(path string) bool {
	for _, s := range []string{"token", "api_key", "password", "key_file"} {
		if strings.Contains(path, s) {
			return true
		}
	}
	return false
}

// short is v printed, cut to a line's worth.
func short(v reflect.Value) string {
	s := fmt.Sprintf("%q", fmt.Sprint(v.Interface()))
	if v.Kind() != reflect.String {
		s = fmt.Sprint(v.Interface())
	}
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}
