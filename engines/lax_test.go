package engines

import "testing"

// TestLax: the values pydantic v2's lax mode takes for an int or bool
// field, and some it refuses.
func TestLax(t *testing.T) {
	intOf := func(read func(string) (int64, bool), in string, want int64, wantOK bool) {
		t.Helper()
		if v, ok := read(in); v != want || ok != wantOK {
			t.Errorf("read(%q) = %d, %v; want %d, %v", in, v, ok, want, wantOK)
		}
	}
	intOf(LaxIntNumber, "8", 8, true)
	intOf(LaxIntNumber, "-8", -8, true)
	intOf(LaxIntNumber, "8.0", 8, true)
	intOf(LaxIntNumber, "80e-1", 8, true)
	intOf(LaxIntNumber, "1E3", 1000, true)
	intOf(LaxIntNumber, "8.5", 0, false)
	intOf(LaxIntNumber, "1e19", 0, false)
	intOf(LaxIntNumber, "9223372036854775808", 0, false)
	intOf(LaxIntNumber, "0", 0, true)
	intOf(LaxIntNumber, "-0", 0, true)
	intOf(LaxIntNumber, "999999999999999999", 999999999999999999, true)
	intOf(LaxIntNumber, "-9223372036854775808", -9223372036854775808, true)
	intOf(LaxIntNumber, "9223372036854775807", 9223372036854775807, true)
	intOf(LaxIntString, " +1_000.00\n", 1000, true)
	intOf(LaxIntString, "-08", -8, true)
	intOf(LaxIntString, "0_8", 8, true)
	intOf(LaxIntString, "00", 0, true)
	for _, in := range []string{"", " ", "8.5", "8.", "1e3", "0x10", "1__0", "_1", "1_", "0_", "+", "9223372036854775808"} {
		intOf(LaxIntString, in, 0, false)
	}

	boolOf := func(read func(string) (bool, bool), in string, want, wantOK bool) {
		t.Helper()
		if v, ok := read(in); v != want || ok != wantOK {
			t.Errorf("read(%q) = %v, %v; want %v, %v", in, v, ok, want, wantOK)
		}
	}
	for _, in := range []string{"1", "1.0", "1.00", "1e0", "10e-1"} {
		boolOf(LaxBoolNumber, in, true, true)
	}
	for _, in := range []string{"0", "-0", "0.0", "-0.0", "0e5"} {
		boolOf(LaxBoolNumber, in, false, true)
	}
	for _, in := range []string{"2", "-1", "0.5"} {
		boolOf(LaxBoolNumber, in, false, false)
	}
	for _, in := range []string{"1", "t", "Y", "yes", "On", "TRUE"} {
		boolOf(LaxBoolString, in, true, true)
	}
	for _, in := range []string{"0", "F", "n", "No", "oFF", "false"} {
		boolOf(LaxBoolString, in, false, true)
	}
	// No whitespace, and no numbers but "0" and "1".
	for _, in := range []string{"", " true", "true ", "1.0", "2", "yess", "maybe"} {
		boolOf(LaxBoolString, in, false, false)
	}
}
