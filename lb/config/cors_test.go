package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestCORSValidate(t *testing.T) {
	f := func(edit func(*CORS), wantError string) {
		t.Helper()
		c := DefaultCORS()
		edit(&c)
		err := c.Validate()
		if wantError == "" {
			if err != nil {
				t.Errorf("%+v: %v", c, err)
			}
			return
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), wantError) {
			t.Errorf("%+v: %v, want an error saying %s", c, err, wantError)
		}
	}
	f(func(*CORS) {}, "")
	f(func(c *CORS) {
		c.AllowedOrigins = []string{"https://app.example.com", "http://localhost:3000", "null", "*"}
		c.AllowedMethods, c.AllowedHeaders, c.ExposeHeaders = []string{"GET", "POST"}, []string{"Authorization", "X-Api-Key"}, []string{"x-request-id"}
	}, "")
	f(func(c *CORS) { c.AllowedOrigins = nil }, "")
	f(func(c *CORS) { c.AllowedOrigins = []string{"*", "https://a.example/"} }, `cors.allowed_origins[1] = "https://a.example/" is not an origin`)
	f(func(c *CORS) { c.AllowedOrigins = []string{"a.example"} }, `cors.allowed_origins[0] = "a.example" is not an origin`)
	f(func(c *CORS) { c.AllowedOrigins = []string{"https://a.example/app"} }, `"https://a.example/app" is not an origin`)
	f(func(c *CORS) { c.AllowedOrigins = []string{"https://*.example.com"} }, `"https://*.example.com" is not an origin`)
	f(func(c *CORS) { c.AllowedOrigins = []string{"https://App.example.com"} }, `"https://App.example.com" must be in lower case`)
	f(func(c *CORS) { c.AllowedMethods = []string{"GET POST"} }, `cors.allowed_methods[0] = "GET POST" is not a token`)
	f(func(c *CORS) { c.AllowedHeaders = []string{"authorization", "x:y"} }, `cors.allowed_headers[1] = "x:y" is not a token`)
	f(func(c *CORS) { c.ExposeHeaders = []string{""} }, `cors.expose_headers[0] = "" is not a token`)
	f(func(c *CORS) { c.MaxAge = -time.Second }, `cors.max_age = "-1s" must be whole seconds, not negative`)
	f(func(c *CORS) { c.MaxAge = 1500 * time.Millisecond }, `cors.max_age = "1.5s" must be whole seconds`)
	f(func(c *CORS) { c.AllowedOrigins = []string{"https://a.example:443"} }, `"https://a.example:443" names its scheme's default port`)
	f(func(c *CORS) { c.AllowedOrigins = []string{"http://a.example:80"} }, `"http://a.example:80" names its scheme's default port`)
	f(func(c *CORS) { c.AllowedOrigins = []string{"https://a.example:8443", "http://a.example:8080"} }, "")
	f(func(c *CORS) { c.AllowedOrigins = []string{"https://bücher.example"} }, `must name its host in punycode`)
	f(func(c *CORS) { c.AllowedOrigins = []string{"https://xn--bcher-kva.example"} }, "")
	f(func(c *CORS) { c.AllowedMethods = []string{"GET", "post"} }, `cors.allowed_methods[1] = "post" must be POST, as browsers send it`)
	f(func(c *CORS) { c.AllowedMethods = []string{"patch", "PATCH"} }, "") // Fetch does not upper-case PATCH
	f(func(c *CORS) { c.ExposeHeaders = []string{"*"} }, "")
	f(func(c *CORS) { c.ExposeHeaders, c.AllowCredentials = []string{"*"}, true }, `cors.expose_headers = [*] holds "*"`)
	// The whole configuration's check runs the section's.
	c := Default()
	c.Pods = []Pod{{Name: "p", Model: "m", Address: "127.0.0.1:8000"}}
	c.Provision()
	c.CORS.AllowedOrigins = []string{"https://a.example/"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "cors.allowed_origins[0]") {
		t.Errorf("Config.Validate: %v, want the cors section's error", err)
	}
}

// TestCORSYAML: the section's keys, and an empty origin list turning CORS
// off rather than falling back to the default.
func TestCORSYAML(t *testing.T) {
	c := Default()
	if !c.CORS.Enabled() || !reflect.DeepEqual(c.CORS, DefaultCORS()) {
		t.Fatalf("default %+v, want on, vLLM's defaults", c.CORS)
	}
	err := c.UnmarshalYAML([]byte("cors:\n  allowed_origins: [https://a.example]\n  allowed_methods: [POST]\n  allowed_headers: [authorization]\n  allow_credentials: true\n  expose_headers: [x-request-id]\n  max_age: 1h\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := CORS{AllowedOrigins: []string{"https://a.example"}, AllowedMethods: []string{"POST"}, AllowedHeaders: []string{"authorization"},
		AllowCredentials: true, ExposeHeaders: []string{"x-request-id"}, MaxAge: time.Hour}
	if !reflect.DeepEqual(c.CORS, want) {
		t.Errorf("got %+v, want %+v", c.CORS, want)
	}
	c = Default()
	if err := c.UnmarshalYAML([]byte("cors:\n  allowed_origins: []\n")); err != nil {
		t.Fatal(err)
	}
	if c.CORS.Enabled() {
		t.Errorf("allowed_origins: [] left CORS on: %+v", c.CORS)
	}
}
