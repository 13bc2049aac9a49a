package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/lb/pool"
)

// A whole answer's call takes a connection from the pod's client and
// makes the exchange itself, as the event loop's does: the request is
// rendered straight into the bytes its read of the answer sends
// (AppendRequest, Conn.writeRequest), and a plain head (ScanHead) is
// read without fasthttp's parser, its lines kept as the pod sent them
// (AnswerHead). fasthttp's Do would render through a pooled writer, parse
// and store every field, and, for a call that may be cut, take the answer
// as a stream (so that the connection stays the call's until the watch
// ends) and copy its body twice. Here the connection is the call's until
// it gives it back, after the watch ended. A head that is not plain, or
// a body that is not of a known length, is read by fasthttp's parser
// from the same reader.

// watch is a call's side of its cuts: whichever of Cut and answered
// comes first decides. conn holds the net.Conn the call went on last
// (on), which Cut closes; a call sent again on a new connection (Stale)
// stores that one, of the same type.
type watch struct {
	state atomic.Int32
	conn  atomic.Value
}

// Cut closes the call's connection, unless it was answered first; a
// call without one yet learns of the cut from the state (on).
func (w *watch) Cut() {
	if w.state.CompareAndSwap(watching, left) {
		if c, ok := w.conn.Load().(net.Conn); ok {
			_ = c.Close()
		}
	}
}

// on records the connection the call goes on, before a byte goes: false
// when the call was cut before.
func (w *watch) on(c net.Conn) bool {
	// Stored before the state is read, as Cut sets the state before it
	// loads the connection: one of the two sees the other.
	w.conn.Store(c)
	return w.state.Load() != left
}

// answered ends the watch of an answered call: false when it was cut
// first (its connection is closed, or closing).
func (w *watch) answered() bool { return w.state.CompareAndSwap(watching, answered) }

// watchCuts watches cuts for a call: nil when none of them is set.
func watchCuts(cuts []Cut) *watch {
	if !slices.ContainsFunc(cuts, func(c Cut) bool { return c != nil }) {
		return nil
	}
	w := new(watch)
	w.watchAll(cuts)
	return w
}

// watchAll has each of cuts that is set watch w.
func (w *watch) watchAll(cuts []Cut) {
	for _, c := range cuts {
		if c != nil {
			c.Watch(w)
		}
	}
}

func (w *watch) unwatch(cuts []Cut) {
	for _, c := range cuts {
		if c != nil {
			c.Unwatch(w)
		}
	}
}

// callWhole is DoCut's call of a whole answer: the answer's head is due
// by headBy, the rest by deadline. head, when set, takes a plain head's
// lines, and resp's header then holds only the status, framing and
// Connection: close (head.Raw); otherwise resp's header holds every
// field. A call on a kept connection its pod closed as it idled is made
// again on another (Conn.Stale), as doKept does.
func callWhole(client *fasthttp.HostClient, up *fasthttp.Request, resp *fasthttp.Response, head *AnswerHead, headBy, deadline time.Time, cuts []Cut) error {
	w := watchCuts(cuts)
	if w != nil {
		defer w.unwatch(cuts)
	}
	if head != nil {
		head.Raw = false
	}
	for {
		stale, err := exchangeWhole(client, up, resp, head, headBy, deadline, w)
		if !stale {
			return err
		}
	}
}

// exchangeWhole is one of callWhole's exchanges; stale: it failed as
// Conn.Stale says, and may be made again.
func exchangeWhole(client *fasthttp.HostClient, up *fasthttp.Request, resp *fasthttp.Response, head *AnswerHead, headBy, deadline time.Time, w *watch) (stale bool, err error) {
	wait := time.Until(headBy)
	if wait <= 0 {
		return false, fasthttp.ErrTimeout
	}
	resp.Reset()
	if w != nil && w.state.Load() == left {
		// Not dialed for: its client left as it was watched.
		return false, ErrCut
	}
	cc, err := client.AcquireConn(wait, up.ConnectionClose())
	if err != nil {
		return false, err
	}
	conn := cc.Conn()
	if w != nil && !w.on(conn) {
		client.CloseConn(cc)
		return false, ErrCut
	}
	c, _ := conn.(*Conn)
	if c != nil {
		// A Stale call is made again (callWhole), so a connection that
		// answered lately goes unlooked-at.
		c.sendsAgain = true
	}
	keep := false
	defer func() {
		if w != nil && !stale && !w.answered() {
			err, stale = ErrCut, false
		}
		if err == nil && keep {
			client.ReleaseConn(cc)
		} else {
			client.CloseConn(cc)
		}
	}()
	_ = conn.SetWriteDeadline(headBy)
	_ = conn.SetReadDeadline(headBy)
	if c != nil {
		err = c.writeRequest(up)
	} else {
		_, err = conn.Write(AppendRequest(nil, up))
	}
	if err != nil {
		if pool.IsTimeout(err) {
			err = fasthttp.ErrTimeout
		}
		return c != nil && c.Stale(), err
	}
	br := client.AcquireReader(conn)
	defer client.ReleaseReader(br)
	if _, err = br.Peek(1); err != nil {
		// No byte of an answer: as fasthttp's client says it.
		if pool.IsTimeout(err) {
			return false, fasthttp.ErrTimeout
		}
		return c != nil && c.Stale(), fasthttp.ErrConnectionClosed
	}
	a := answer{br: br, resp: resp, limit: client.MaxResponseBodySize, conn: conn}
	if headBy.Before(deadline) {
		a.bodyBy = deadline
	}
	plain := false
	if head != nil && !up.Header.IsHead() {
		plain, err = a.readPlain(head)
	}
	if !plain {
		err = a.readParsed(up.Header.IsHead(), client.DisableHeaderNamesNormalizing)
	}
	// Bytes after the answer: nobody asked for them, and the connection
	// is out of step.
	keep = err == nil && br.Buffered() == 0 && !up.ConnectionClose() && !resp.ConnectionClose()
	return false, err
}

// answer is an answer being read from br into resp, its body at most
// limit bytes (0: no bound) and due by bodyBy (zero: by the deadline the
// head had) on conn.
type answer struct {
	br     *bufio.Reader
	resp   *fasthttp.Response
	limit  int
	conn   net.Conn
	bodyBy time.Time
}

// headed moves the read deadline to the body's, once the head is in.
func (a *answer) headed() {
	if !a.bodyBy.IsZero() {
		_ = a.conn.SetReadDeadline(a.bodyBy)
	}
}

// readPlain reads an answer whose head is plain (ScanHead) and whose body
// has a length, its head's lines into head. plain false: the answer is
// none such, and nothing of it was read.
func (a *answer) readPlain(head *AnswerHead) (plain bool, err error) {
	br, resp := a.br, a.resp
	var h PlainHead
	for {
		buf, _ := br.Peek(br.Buffered())
		var ok bool
		if h, ok = ScanHead(buf); ok {
			break
		}
		if len(buf) == br.Size() || bytes.Contains(buf, []byte("\r\n\r\n")) {
			// Not plain, or too long: fasthttp's parser judges it.
			return false, nil
		}
		if _, err := br.Peek(len(buf) + 1); err != nil {
			return false, nil
		}
	}
	if h.Length < 0 {
		return false, nil
	}
	h.Into(resp, head)
	_, _ = br.Discard(h.N)
	a.headed()
	if h.Status == fasthttp.StatusNoContent || h.Status == fasthttp.StatusNotModified {
		// No body, whatever the header says (RFC 9112 6.3).
		return true, nil
	}
	// Of the length set above: sized once, the part past the reader's
	// buffer read straight into it.
	return true, bodyError(resp.ReadBody(br, a.limit))
}

// readParsed reads the answer with fasthttp's parser, as its client
// does; keepNames: the field names as the pod sent them.
func (a *answer) readParsed(isHead, keepNames bool) error {
	resp := a.resp
	if keepNames {
		resp.Header.DisableNormalizing()
	}
	if err := ReadHead(&resp.Header, a.br); err != nil {
		return headError(err)
	}
	a.headed()
	code := resp.StatusCode()
	if isHead || code == fasthttp.StatusNoContent || code == fasthttp.StatusNotModified {
		return nil
	}
	err := resp.ReadBody(a.br, a.limit)
	if err == nil && resp.Header.ContentLength() == -1 {
		err = resp.Header.ReadTrailer(a.br)
	}
	return bodyError(err)
}

// headError is the error of an answer whose head broke off or did not
// parse, its first byte in: the read's own, or ErrPodHead for one that
// does not parse (fasthttp's would quote the head).
func headError(err error) error {
	var small *fasthttp.ErrSmallBuffer
	var op *net.OpError
	switch {
	case pool.IsTimeout(err):
		return fasthttp.ErrTimeout
	case errors.Is(err, io.EOF):
		return io.ErrUnexpectedEOF
	case errors.As(err, &op):
		return op
	case err == ErrTooManyInterim, errors.As(err, &small):
		return err
	}
	return ErrPodHead
}

// bodyError is the error of a body that broke off: the pod's close
// before its end is io.ErrUnexpectedEOF, as fasthttp says it.
func bodyError(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
