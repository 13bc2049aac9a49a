package frontend

import (
	"errors"
	"strings"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Block is the header block a client's HEADERS frame starts, with its
// CONTINUATIONs, decoded into fields the connection keeps from one block
// to the next. The framer's own decoding (ReadMetaHeaders) allocates a
// frame, a field list and a callback for every block, half of what an
// h2 request allocated. A connection's run goroutine alone uses it.
type h2Block struct {
	http2.FrameHeader
	Priority http2.PriorityParam
	// Fields are the decoded fields, the pseudo-headers first; their
	// strings are the decoder's and stay valid, the slice only until the
	// next block.
	Fields []hpack.HeaderField
	// Truncated: the block is over the header list limit, and Fields end
	// before it does.
	Truncated bool

	dec        *hpack.Decoder
	limit      uint32 // SETTINGS_MAX_HEADER_LIST_SIZE, in RFC 9113 6.5.2's bytes
	remain     uint32 // what is left of limit for this block's fields
	trailers   uint32 // and for its "trailer" fields, a budget of their own
	sawRegular bool
	invalid    error // why the block is malformed; nil when it is not
}

func newH2Block(limit uint32) *h2Block {
	b := &h2Block{limit: limit}
	b.dec = hpack.NewDecoder(4096, b.emit)
	b.dec.SetMaxStringLength(int(limit))
	return b
}

// Malformed header blocks (RFC 9113 8.2.1, 8.3): a stream error.
var (
	errH2FieldName      = errors.New("frontend: invalid HTTP/2 header field name")
	errH2FieldValue     = errors.New("frontend: invalid HTTP/2 header field value")
	errH2PseudoAfter    = errors.New("frontend: HTTP/2 pseudo-header after a regular header")
	errH2PseudoUnknown  = errors.New("frontend: unknown HTTP/2 pseudo-header")
	errH2PseudoRepeated = errors.New("frontend: repeated HTTP/2 pseudo-header")
	errH2PseudoMixed    = errors.New("frontend: HTTP/2 request and response pseudo-headers mixed")
)

// read decodes the block hf starts, reading its CONTINUATIONs from fr
// (whose frame order check lets nothing else in between). A malformed
// block is a StreamError; one HPACK cannot decode, or that goes on after
// being found malformed or far over the limit, a ConnectionError.
func (b *h2Block) read(fr *http2.Framer, hf *http2.HeadersFrame) error {
	b.FrameHeader, b.Priority = hf.FrameHeader, hf.Priority
	b.Fields, b.Truncated = b.Fields[:0], false
	b.remain, b.trailers, b.sawRegular, b.invalid = b.limit, b.limit, false, nil
	b.dec.SetEmitEnabled(true)
	frag, ended := hf.HeaderBlockFragment(), hf.HeadersEnded()
	for {
		// A fragment over twice what is left of both budgets, or any
		// after the limit was passed (which empties them) or a field
		// found malformed (which stopped the counting), ends the
		// connection rather than costing the decoding (CONTINUATION
		// floods).
		if int64(len(frag)) > 2*(int64(b.remain)+int64(b.trailers)) || b.invalid != nil {
			return http2.ConnectionError(http2.ErrCodeProtocol)
		}
		if _, err := b.dec.Write(frag); err != nil {
			return http2.ConnectionError(http2.ErrCodeCompression)
		}
		if ended {
			break
		}
		f, err := fr.ReadFrame()
		if err != nil {
			return err
		}
		cf, ok := f.(*http2.ContinuationFrame)
		if !ok {
			return http2.ConnectionError(http2.ErrCodeProtocol)
		}
		frag, ended = cf.HeaderBlockFragment(), cf.HeadersEnded()
	}
	if err := b.dec.Close(); err != nil {
		return http2.ConnectionError(http2.ErrCodeCompression)
	}
	if b.invalid == nil {
		b.invalid = b.checkPseudos()
	}
	if b.invalid != nil {
		return http2.StreamError{StreamID: b.StreamID, Code: http2.ErrCodeProtocol, Cause: b.invalid}
	}
	return nil
}

// emit is the decoder's callback for each field. Past a malformed field
// or the limit the decoder goes on without emitting, which keeps its
// table in step with the client's.
func (b *h2Block) emit(hf hpack.HeaderField) {
	pseudo := strings.HasPrefix(hf.Name, ":")
	switch {
	case !httpguts.ValidHeaderFieldValue(hf.Value):
		b.invalid = errH2FieldValue
	case pseudo && b.sawRegular:
		b.invalid = errH2PseudoAfter
	case !pseudo && !h2FieldName(hf.Name):
		b.invalid = errH2FieldName
	}
	b.sawRegular = b.sawRegular || !pseudo
	if b.invalid != nil {
		b.dec.SetEmitEnabled(false)
		return
	}
	remain, size := &b.remain, hf.Size()
	if hf.Name == "trailer" {
		// Each name it announces becomes a header a request may carry
		// at its end, so each costs a field's 32 bytes of overhead (as
		// x/net's framer counts it): a few KB of short names would
		// otherwise make a trailer set of thousands.
		n := uint32(strings.Count(hf.Value, ",") + 1)
		remain, size = &b.trailers, uint32(len(hf.Value))-n+1+32*n
	}
	if size > *remain {
		b.dec.SetEmitEnabled(false)
		b.Truncated, b.remain, b.trailers = true, 0, 0
		return
	}
	*remain -= size
	b.Fields = append(b.Fields, hf)
}

// h2FieldName reports whether name is a token in lower case, as HTTP/2
// requires of a field name (RFC 9113 8.2.1).
func h2FieldName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !httpguts.IsTokenRune(rune(c)) || 'A' <= c && c <= 'Z' {
			return false
		}
	}
	return true
}

// checkPseudos finds a pseudo-header that is unknown or repeated, or a
// block that mixes a request's and a response's (RFC 9113 8.3).
func (b *h2Block) checkPseudos() error {
	var request, response bool
	pf := b.PseudoFields()
	for i, hf := range pf {
		switch hf.Name {
		case ":method", ":path", ":scheme", ":authority", ":protocol":
			request = true
		case ":status":
			response = true
		default:
			return errH2PseudoUnknown
		}
		for _, prev := range pf[:i] {
			if prev.Name == hf.Name {
				return errH2PseudoRepeated
			}
		}
	}
	if request && response {
		return errH2PseudoMixed
	}
	return nil
}

// PseudoFields are the block's pseudo-headers, RegularFields the rest.
func (b *h2Block) PseudoFields() []hpack.HeaderField {
	return b.Fields[:b.pseudoCount()]
}

func (b *h2Block) RegularFields() []hpack.HeaderField {
	return b.Fields[b.pseudoCount():]
}

func (b *h2Block) pseudoCount() int {
	for i, hf := range b.Fields {
		if !strings.HasPrefix(hf.Name, ":") {
			return i
		}
	}
	return len(b.Fields)
}

// PseudoValue is the value of pseudo-header ":"+name, "" when absent.
func (b *h2Block) PseudoValue(name string) string {
	for _, hf := range b.PseudoFields() {
		if hf.Name[1:] == name {
			return hf.Value
		}
	}
	return ""
}

func (b *h2Block) StreamEnded() bool {
	return b.Flags.Has(http2.FlagHeadersEndStream)
}

// selfDependent reports whether the block's priority makes its stream
// depend on itself, a stream error (RFC 9113 5.3.1).
func (b *h2Block) selfDependent() bool {
	return b.Flags.Has(http2.FlagHeadersPriority) && b.Priority.StreamDep == b.StreamID
}
