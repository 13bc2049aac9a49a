package openai

import "unsafe"

// b2s views b as a string without copying. The string must not outlive b's
// contents; the package uses it only to pass body bytes to sonic's unquote
// and to switch on keys.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
