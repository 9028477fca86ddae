package matrix

import (
	"errors"
	"io"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestConnectResponses compares, byte for byte, what konn's and upstream's
// HTTP CONNECT frontends answer when a tunnel cannot be made (no agent, a
// refused dial, a dial timing out at the agent) and to requests that are
// not CONNECT, since clients parse these answers.
func TestConnectResponses(t *testing.T) {
	e := theEnv
	d := e.dest
	cases := []struct {
		name, req string
		agent     bool
		killAgent bool // SIGKILL the agent 500 ms after sending req
	}{
		{"no agent", "CONNECT " + d.http + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", false, false},
		{"malformed request", "CONNECT\r\n\r\n", false, false},
		{"GET instead of CONNECT", "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", false, false},
		{"refused dial", "CONNECT " + d.closed + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", true, false},
		{"dial timeout at the agent", "CONNECT " + d.hang + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", true, false},
		{"agent gone during the dial", "CONNECT " + d.hang + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", true, true},
	}
	type answer struct{ bytes, end string }
	got := map[string]map[string]answer{}
	for _, impl := range []string{upstream, konn} {
		got[impl] = map[string]answer{}
		dir := t.TempDir()
		s, err := newServer(e, dir, impl, "http-connect", false, "connect-"+impl, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.start(t, e); err != nil {
			t.Fatal(err)
		}
		var a *agent
		for _, c := range cases {
			if c.agent && a == nil {
				if a, err = startAgent(t, e, dir, upstream, "connect-agent", s.agent); err != nil {
					t.Fatal(err)
				}
				if err := s.waitReady(deadline); err != nil {
					t.Fatal(err)
				}
			}
			var during func()
			if c.killAgent {
				during = func() {
					time.Sleep(500 * time.Millisecond)
					a.p.kill()
				}
			}
			b, end := rawExchange(t, s.uds, c.req, during)
			got[impl][c.name] = answer{b, end}
		}
	}
	// Go's net/http adds a Date header; its value cannot match.
	date := regexp.MustCompile("Date: [^\r]*\r\n")
	for _, c := range cases {
		up, kn := got[upstream][c.name], got[konn][c.name]
		if c.name == "GET instead of CONNECT" {
			// Deliberate: konn sends no Date header and closes the
			// connection after the 405; upstream keeps it open.
			up.bytes = date.ReplaceAllString(up.bytes, "")
			if up.end != "left open" || kn.end != "closed" {
				t.Errorf("%s: the connection was %s by upstream and %s by konn; want left open and closed", c.name, up.end, kn.end)
			}
			up.end = kn.end
		}
		if c.name == "agent gone during the dial" {
			// Deliberate: konn names the reason (upstream: the Go
			// context's error).
			up.bytes = strings.Replace(up.bytes, "Backend context error: context canceled",
				"Backend context error: backend connection closed before the dial completed", 1)
		}
		if up != kn {
			t.Errorf("%s:\nupstream %q, then %s\nkonn     %q, then %s", c.name,
				got[upstream][c.name].bytes, got[upstream][c.name].end, kn.bytes, kn.end)
		} else {
			t.Logf("%s: %q, then %s", c.name, kn.bytes, kn.end)
		}
	}
}

// rawExchange sends req on a new connection to the Unix socket and
// returns everything that comes back, and how the connection ended
// ("closed", or "left open" after 2 s of silence).
func rawExchange(t *testing.T, uds, req string, during func()) (string, string) {
	c, err := net.Dial("unix", uds)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	if during != nil {
		during()
	}
	var b []byte
	buf := make([]byte, 4096)
	end := "closed"
	overall := time.Now().Add(deadline)
	for {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := c.Read(buf)
		b = append(b, buf[:n]...)
		if err == nil {
			if time.Now().After(overall) {
				end = "still sending"
				break
			}
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if len(b) == 0 && time.Now().Before(overall) {
				continue // no answer yet (a dial timing out takes 5 s)
			}
			end = "left open"
		} else if err != io.EOF {
			end = err.Error()
		}
		break
	}
	return string(b), end
}
