package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Payload is n deterministic pseudo-random bytes (ChaCha8 keyed by seed).
func Payload(n int, seed uint64) []byte {
	var key [32]byte
	for i := range 8 {
		key[i] = byte(seed >> (8 * i))
	}
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	return b
}

// Sum is the first 8 bytes of b's SHA-256, in hex.
func Sum(b []byte) string { s := sha256.Sum256(b); return fmt.Sprintf("%x", s[:8]) }

// LimitedBuffer keeps the first 64 KiB written (for error messages).
type LimitedBuffer struct{ bytes.Buffer }

func (l *LimitedBuffer) Write(p []byte) (int, error) {
	if room := 64<<10 - l.Len(); room > 0 {
		l.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

type countWriter struct{ n int }

func (c *countWriter) Write(p []byte) (int, error) { c.n += len(p); return len(p), nil }

// KubectlStdin runs kubectl within d with in on stdin (env added to its
// environment) and returns what Sum gives for its stdout, and stdout's
// length. stdout itself is not kept.
func (a *APIServer) KubectlStdin(d time.Duration, env []string, in []byte, args ...string) (string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := a.KubectlCmd(ctx, args...)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdin = bytes.NewReader(in)
	h := sha256.New()
	cw := &countWriter{}
	var stderr LimitedBuffer
	cmd.Stdout, cmd.Stderr = io.MultiWriter(h, cw), &stderr
	if err := cmd.Run(); err != nil {
		return "", cw.n, fmt.Errorf("kubectl %s: %v (after %d bytes of stdout): %s", strings.Join(args, " "), err, cw.n, strings.TrimSpace(stderr.String()))
	}
	return fmt.Sprintf("%x", h.Sum(nil)[:8]), cw.n, nil
}

var forwardingRE = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> `)

// PortForward runs `kubectl port-forward` to port of the pod and returns
// the local port (on 127.0.0.1 of the control plane namespace) and a
// function that stops kubectl.
func (a *APIServer) PortForward(ctx context.Context, pod string, port int, env []string) (int, func() error, error) {
	cmd := a.KubectlCmd(ctx, "port-forward", "--address=127.0.0.1", "-n", Namespace, "pod/"+pod, ":"+strconv.Itoa(port))
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, nil, err
	}
	var stderr LimitedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	portc := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sent := false
		for sc.Scan() { // keep draining: kubectl prints a line per connection
			if m := forwardingRE.FindStringSubmatch(sc.Text()); m != nil && !sent {
				p, _ := strconv.Atoi(m[1])
				portc <- p
				sent = true
			}
		}
	}()
	stop := func() error {
		cmd.Process.Signal(syscall.SIGTERM)
		err := cmd.Wait()
		if stderr.Len() > 0 && err != nil {
			return fmt.Errorf("kubectl port-forward: %v: %s", err, strings.TrimSpace(stderr.String()))
		}
		return nil
	}
	select {
	case p := <-portc:
		return p, stop, nil
	case <-time.After(30 * time.Second):
		stop()
		return 0, nil, fmt.Errorf("kubectl port-forward printed no local port within 30 s: %s", strings.TrimSpace(stderr.String()))
	}
}

// EchoRoundTrip sends n bytes through addr (dialled in ns) to an echo
// server and reads them back at the same time; the SHA-256 of what came
// back must equal what was sent.
func EchoRoundTrip(ns *NS, addr string, n int, seed uint64, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c, err := ns.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	data := Payload(n, seed)
	werr := make(chan error, 1)
	go func() {
		var err error
		for off := 0; off < n && err == nil; off += 32 << 10 {
			_, err = c.Write(data[off:min(n, off+32<<10)])
		}
		werr <- err
	}()
	got := make([]byte, n)
	k, rerr := io.ReadFull(c, got)
	if err := <-werr; err != nil {
		return fmt.Errorf("writing: %v", err)
	}
	if rerr != nil {
		return fmt.Errorf("reading: %v after %d of %d bytes", rerr, k, n)
	}
	if Sum(got) != Sum(data) {
		return fmt.Errorf("echoed SHA-256 %s… differs from sent %s…", Sum(got), Sum(data))
	}
	return nil
}

// LogStream is a running `kubectl logs -f`.
type LogStream struct {
	Lines  <-chan string // closed when kubectl's stdout ends
	cmd    interface{ Wait() error }
	kill   func()
	stderr *LimitedBuffer
	cancel context.CancelFunc
}

// FollowLogs starts `kubectl logs -f` for the pod's container; d bounds
// the whole stream.
func (a *APIServer) FollowLogs(d time.Duration, pod string) (*LogStream, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	cmd := a.KubectlCmd(ctx, "logs", "-f", "-n", Namespace, pod, "-c", Container)
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	ls := &LogStream{cmd: cmd, stderr: &LimitedBuffer{}, cancel: cancel}
	cmd.Stderr = ls.stderr
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	ls.kill = func() { cmd.Process.Kill() }
	lines := make(chan string, 64)
	ls.Lines = lines
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return ls, nil
}

// Next waits up to d for the next line, which must be want.
func (l *LogStream) Next(want string, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case line, ok := <-l.Lines:
		if !ok {
			return fmt.Errorf("kubectl logs -f ended before %q arrived: %s", want, strings.TrimSpace(l.stderr.String()))
		}
		if line != want {
			return fmt.Errorf("kubectl logs -f printed %q, want %q", line, want)
		}
		return nil
	case <-timer.C:
		return fmt.Errorf("%q did not arrive within %v", want, d)
	}
}

// Wait waits up to d for kubectl to exit by itself (the log ended).
func (l *LogStream) Wait(d time.Duration) error {
	defer l.cancel()
	done := make(chan error, 1)
	go func() {
		for range l.Lines {
		}
		done <- l.cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("kubectl logs -f: %v: %s", err, strings.TrimSpace(l.stderr.String()))
		}
		return nil
	case <-time.After(d):
		l.kill()
		<-done
		return fmt.Errorf("kubectl logs -f did not end within %v of the log's end", d)
	}
}

// Kill ends kubectl.
func (l *LogStream) Kill() {
	l.kill()
	for range l.Lines {
	}
	l.cmd.Wait()
	l.cancel()
}
