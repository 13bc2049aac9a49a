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
// key, pd), the completion itself (hedge.x, own.w.r: own's writer points
// at own), what it keeps for its next request (own.body, the body buffer
// of its own response; own.bodyStreamWriter, fasthttp's writer of a
// sized body stream, which no Reset drops), what observeEnd clears at
// every request's end (tr, explained), and times.
func TestReleaseCompletionDropsPointers(t *testing.T) {
	skip := map[string]bool{"req": true, "key": true, "pd": true, "hedge.x": true, "own.w.r": true, "own.body": true, "own.bodyStreamWriter": true,
		"tr": true, "explained": true}
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

// TestOwnResponseKeepsItsBody: a completion's own response keeps its body
// buffer from one request to the next, unless it grew past maxKeptBody,
// and comes back empty either way.
func TestOwnResponseKeepsItsBody(t *testing.T) {
	for _, size := range []int{1 << 10, maxKeptBody + 1} {
		x := acquireCompletion(time.Now())
		x.resp = &x.own
		x.own.SetBody(make([]byte, size))
		was := unsafe.SliceData(x.own.Body())
		releaseCompletion(x)
		kept := unsafe.SliceData(x.own.Body()) == was
		if n := len(x.own.Body()); n != 0 {
			t.Errorf("%d-byte body: %d bytes left in the released response", size, n)
		}
		if want := size <= maxKeptBody; kept != want {
			t.Errorf("%d-byte body: buffer kept %v, want %v", size, kept, want)
		}
	}
}
