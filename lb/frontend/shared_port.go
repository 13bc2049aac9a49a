package frontend

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SharedWith names the processes already listening on addr, beside which
// Listen's SO_REUSEPORT bind succeeds and the kernel then splits new
// connections between them and this one: the point during an upgrade in
// place, and a trap when a second gateway is started by mistake (each
// serving half the clients with its own configuration, the metrics
// scrapes alternating between the two). Each is "pid N (command)", or
// "a process this user cannot see" when no readable process holds the
// socket. It reads the listening sockets of the network namespace
// (/proc/net/tcp, tcp6), once, before a bind; a port of 0, or no /proc,
// names nobody.
func SharedWith(addr string) []string {
	want, ok := listenAddr(addr)
	if !ok || want.Port() == 0 {
		return nil
	}
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		listeningOn(table, want, inodes)
	}
	if len(inodes) == 0 {
		return nil
	}
	owners, found := socketOwners(inodes)
	if found < len(inodes) {
		owners = append(owners, "a process this user cannot see")
	}
	return owners
}

// listenAddr is addr as a listener binds it; an empty or unspecified host
// is the unspecified address, which the tables hold as 0.0.0.0 or ::.
func listenAddr(addr string) (netip.AddrPort, bool) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.AddrPort{}, false
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	if host == "" {
		return netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(p)), true
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		ta, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			return netip.AddrPort{}, false
		}
		return ta.AddrPort(), true
	}
	return netip.AddrPortFrom(ip, uint16(p)), true
}

// listeningOn adds to inodes those of table's listening sockets bound to
// want (any unspecified address matches another).
func listeningOn(table string, want netip.AddrPort, inodes map[string]bool) {
	f, err := os.Open(table)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" { // TCP_LISTEN
			continue
		}
		local, ok := procAddr(fields[1])
		if !ok || local.Port() != want.Port() {
			continue
		}
		a, w := local.Addr().Unmap(), want.Addr().Unmap()
		if a == w || (a.IsUnspecified() && w.IsUnspecified()) {
			inodes[fields[9]] = true
		}
	}
}

// procAddr parses a /proc/net/tcp address: the address as 32-bit words in
// the machine's byte order, in hex, a colon, the port in hex.
func procAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	if !ok || err != nil {
		return netip.AddrPort{}, false
	}
	words, err := hex.DecodeString(h)
	if err != nil || (len(words) != 4 && len(words) != 16) {
		return netip.AddrPort{}, false
	}
	b := make([]byte, len(words))
	for i := 0; i < len(words); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(words[i:]))
	}
	ip, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(ip, uint16(port)), true
}

// socketOwners names the processes holding a socket of inodes, each once
// (gnet's loops listen with a socket each), and counts the sockets found.
func socketOwners(inodes map[string]bool) (owners []string, found int) {
	seen, named := map[string]bool{}, map[string]bool{}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		link, err := os.Readlink(fd)
		ino, ok := strings.CutPrefix(link, "socket:[")
		if err != nil || !ok {
			continue
		}
		ino = strings.TrimSuffix(ino, "]")
		if !inodes[ino] || seen[ino] {
			continue
		}
		seen[ino] = true
		found++
		pid := strings.Split(fd, "/")[2]
		if named[pid] {
			continue
		}
		named[pid] = true
		comm, _ := os.ReadFile("/proc/" + pid + "/comm")
		owners = append(owners, fmt.Sprintf("pid %s (%s)", pid, bytes.TrimSpace(comm)))
	}
	return owners, found
}
