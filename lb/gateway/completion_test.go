package gateway

import (
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// TestReleaseCompletionDropsPointers: a completion goes back to its pool
// holding no pointer of the request it served (its connection, pod,
// writer, response...), which would keep them alive until the pool
// hands it out again. Every pointer field, nested structs' too, is set,
// then released. Left out: those released by a call of their own (req,
// key, pd), the completion itself (hedge.x), what observeEnd clears at
// every request's end (tr, explained), and times.
func TestReleaseCompletionDropsPointers(t *testing.T) {
	skip := map[string]bool{"req": true, "key": true, "pd": true, "hedge.x": true, "tr": true, "explained": true}
	x := acquireCompletion(time.Now())
	var set func(v reflect.Value, path string)
	var paths []string
	set = func(v reflect.Value, path string) {
		for i := range v.NumField() {
			f := v.Type().Field(i)
			fv := reflect.NewAt(f.Type, unsafe.Pointer(v.Field(i).UnsafeAddr())).Elem()
			switch name := path + f.Name; {
			case skip[name], f.Type == reflect.TypeFor[time.Time]():
			case f.Type.Kind() == reflect.Pointer:
				fv.Set(reflect.New(f.Type.Elem()))
				paths = append(paths, name)
			case f.Type.Kind() == reflect.Struct:
				set(fv, name+".")
			}
		}
	}
	set(reflect.ValueOf(x).Elem(), "")
	kept := reflect.ValueOf(x).Elem()
	releaseCompletion(x)
	for _, p := range paths {
		v := kept
		for _, name := range strings.Split(p, ".") {
			v = v.FieldByName(name)
		}
		if !v.IsNil() {
			t.Errorf("released completion still holds %s", p)
		}
	}
}
