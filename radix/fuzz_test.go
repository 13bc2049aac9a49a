package radix

import "testing"

// FuzzTree decodes operations from the fuzz input and checks the tree
// against the naive model after each one. The first byte picks the pod
// capacity (0: unlimited); then each operation is a byte of kind and pod,
// a length byte, and that many token bytes. Tokens come from a small
// alphabet, so chains share prefixes and diverge at every depth; kind 3
// inserts the tokens themselves as keys, which are not chains.
func FuzzTree(f *testing.F) {
	f.Add([]byte{0, 0x00, 5, 1, 2, 3, 1, 2, 0x01, 3, 1, 2, 0, 0x10, 4, 1, 2, 3, 1})
	f.Add([]byte{3, 0x00, 6, 0, 0, 0, 0, 0, 0, 0x02, 6, 1, 1, 1, 1, 1, 1, 0x00, 2, 2, 2})
	f.Add([]byte{0, 0x00, 8, 1, 2, 3, 4, 1, 2, 3, 4, 0x11, 8, 1, 2, 3, 4, 1, 2, 3, 4, 0x21, 0, 0x30, 2, 1, 2})
	f.Add([]byte{2, 0x07, 3, 3, 3, 3, 0x17, 3, 3, 3, 3, 0x27, 1, 0x06, 4, 3, 3, 3, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		const pods = 8
		capacity := int(data[0] % 6)
		data = data[1:]
		tr := newTree(t, Options{MaxPods: pods, PodCapacity: capacity})
		m := newModel(pods, capacity)
		var last []uint64
		for len(data) >= 2 {
			kind, pod := data[0]>>4%4, int32(data[0]%pods)
			n := min(int(data[1]%24), len(data)-2)
			toks := make([]uint32, n)
			for i := range toks {
				toks[i] = uint32(data[2+i] % 4)
			}
			data = data[2+n:]
			keys := chain(toks...)
			if kind == 3 {
				// Not a chain: tokens as keys, so keys repeat within and
				// across sequences.
				keys = keys[:0]
				for _, tok := range toks {
					keys = append(keys, uint64(tok))
				}
			}
			switch kind {
			case 0, 3:
				tr.Insert(pod, keys)
				m.insert(pod, keys)
			case 1:
				// The token bytes pick which blocks of the last chain go:
				// an odd token i removes block i, and block i-1 with it
				// when it is 3.
				for i, tok := range toks {
					if tok%2 == 1 && i < len(last) {
						tr.Remove(pod, last[:i+1], int(tok+1)/2)
						m.remove(pod, last[:i+1], int(tok+1)/2)
					}
				}
			case 2:
				tr.RemovePod(pod)
				m.removePod(pod)
			}
			if len(keys) > 0 {
				last = keys
			}
			agree(t, tr, m, keys)
			agree(t, tr, m, last)
			check(t, tr, m)
		}
	})
}
