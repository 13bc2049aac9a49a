package openai

import "pdlb/engines"

// The engines read int and bool fields as pydantic v2's lax mode does
// (engines.LaxIntNumber and its kin): the readers here apply those rules
// to the scanner's values, so the gateway refuses none of what they take.

// laxInt reads the value at s.p as pydantic's lax mode reads an int field:
// an integer; a float without a fraction (8.0, 1e3, as Python's float
// holds it); true or false (1, 0); or a string holding an integer (see
// engines.LaxIntString). ok is false for anything else, or past int64;
// raw is the value's text, quotes included, for error messages.
func (r *Request) laxInt(s *scanner) (v int64, raw []byte, ok bool) {
	f := s.field()
	raw = s.b[f.start:s.p]
	switch f.form {
	case 't':
		return 1, raw, true
	case 'f':
		return 0, raw, true
	case '"':
		text, ok := r.text(f)
		if !ok {
			return 0, raw, false
		}
		v, ok = engines.LaxIntString(b2s(text))
		return v, raw, ok
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		v, ok = engines.LaxIntNumber(b2s(raw))
		return v, raw, ok
	}
	return 0, raw, false
}

// laxBool reads the value at s.p as pydantic's lax mode reads a bool
// field: true or false; a number equal to 0 or 1 (0.0 and 1e0 too); or one
// of the strings engines.LaxBoolString takes. null is false, the API's default.
func (r *Request) laxBool(s *scanner) (v bool, raw []byte, ok bool) {
	f := s.field()
	raw = s.b[f.start:s.p]
	switch f.form {
	case 0, 'f':
		return false, raw, true
	case 't':
		return true, raw, true
	case '"':
		text, ok := r.text(f)
		if !ok {
			return false, raw, false
		}
		v, ok = engines.LaxBoolString(b2s(text))
		return v, raw, ok
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		v, ok = engines.LaxBoolNumber(b2s(raw))
		return v, raw, ok
	}
	return false, raw, false
}
