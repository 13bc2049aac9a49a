package config

import (
	"errors"
	"strings"
	"testing"
)

// TestAdminAndListenApart: the listeners bind with SO_REUSEPORT, so an
// admin address that overlaps listen's binds without error and the kernel
// hands the API's connections to the admin listener (all of them, for a
// more specific address; half, for the same one). Validate refuses it.
func TestAdminAndListenApart(t *testing.T) {
	f := func(listen, admin string, refused bool) {
		t.Helper()
		c := Default()
		c.Listen, c.Admin, c.Access.AdminToken = listen, admin, "t"
		c.Pods = []Pod{{Model: "m", Address: "127.0.0.1:8001"}}
		c.Provision()
		err := c.Validate()
		if !refused {
			if err != nil {
				t.Errorf("listen %q, admin %q: %v", listen, admin, err)
			}
			return
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `admin = "`+admin+`"`) {
			t.Errorf("listen %q, admin %q: %v, want an error naming admin", listen, admin, err)
		}
	}
	f("127.0.0.1:9090", "127.0.0.1:9090", true)
	f(":9090", "127.0.0.1:9090", true)
	f("127.0.0.1:9090", "[::]:9090", true)
	f(":8080", "127.0.0.1:9090", false)
	f("127.0.0.1:9090", "127.0.0.2:9090", false)
	f("127.0.0.1:0", "127.0.0.1:0", false)
	f(":9090", "", false)
}
