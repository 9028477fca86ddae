package matrix

import (
	"io"
	"net"
	"strconv"
	"sync"
)

// lb is a round-robin TCP load balancer in front of the servers' agent
// ports, as in an HA control plane: the agent only knows its address.
type lb struct {
	ln       net.Listener
	port     int
	backends []string
	mu       sync.Mutex
	next     int
	n        []int
	conns    map[net.Conn]bool
}

func startLB(backends []string) (*lb, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	l := &lb{ln: ln, port: port, backends: backends, n: make([]int, len(backends)), conns: map[net.Conn]bool{}}
	go l.serve()
	return l, nil
}

func (l *lb) serve() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		i := l.next
		l.next = (l.next + 1) % len(l.backends)
		l.n[i]++
		l.mu.Unlock()
		go l.relay(c, l.backends[i])
	}
}

func (l *lb) track(c net.Conn, add bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if add {
		if l.conns == nil {
			return false
		}
		l.conns[c] = true
	} else {
		delete(l.conns, c)
	}
	return true
}

func (l *lb) relay(c net.Conn, backend string) {
	defer c.Close()
	b, err := net.DialTimeout("tcp", backend, deadline)
	if err != nil {
		return
	}
	defer b.Close()
	if !l.track(c, true) || !l.track(b, true) {
		return
	}
	defer l.track(c, false)
	defer l.track(b, false)
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(b, c)
	go cp(c, b)
	<-done
	<-done
}

// counts is how many connections went to each backend.
func (l *lb) counts() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.n...)
}

// close stops the balancer and cuts every relayed connection.
func (l *lb) close() {
	l.ln.Close()
	l.mu.Lock()
	conns := l.conns
	l.conns = nil
	l.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}
