package kvxfer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The TCP wire protocol, one pull per connection:
//
//	client → server  "KVX1" | wait ms (uint32) | handle length (uint16) | handle
//	server → client  status (1 byte): statusOK, then length (uint64) and that
//	                 many bytes of KV; or statusNotHeld, and the server closes
//	client → server  ackByte once every byte arrived; only then does the
//	                 server count the KV as picked up and release it
//
// Integers are big-endian. A pull that waits (wait ms > 0) for a handle not
// yet held blocks until it is held, the wait passes, or either side closes.
const (
	magic         = "KVX1"
	statusOK      = 0
	statusNotHeld = 1
	ackByte       = 'A'
	maxHandleLen  = 1024
)

var errProtocol = errors.New("kvxfer: protocol error")

func appendRequest(dst []byte, handle string, waitMS uint32) []byte {
	dst = append(dst, magic...)
	dst = binary.BigEndian.AppendUint32(dst, waitMS)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(handle)))
	return append(dst, handle...)
}

func readRequest(r io.Reader) (handle string, waitMS uint32, err error) {
	var hdr [10]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return "", 0, err
	}
	if string(hdr[:4]) != magic {
		return "", 0, fmt.Errorf("%w: bad magic %q", errProtocol, hdr[:4])
	}
	waitMS = binary.BigEndian.Uint32(hdr[4:8])
	n := binary.BigEndian.Uint16(hdr[8:10])
	if n == 0 || n > maxHandleLen {
		return "", 0, fmt.Errorf("%w: handle length %d", errProtocol, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", 0, err
	}
	return string(b), waitMS, nil
}
