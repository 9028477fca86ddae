package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Cleaner registers functions to run at the end (testing.TB does; the demo
// has its own). They run last-registered first.
type Cleaner interface {
	Cleanup(func())
}

// Stack is a Cleaner for programs that are not tests.
type Stack struct {
	mu  sync.Mutex
	fns []func()
}

func (s *Stack) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fns = append(s.fns, f)
}

// Run runs the registered functions, last first.
func (s *Stack) Run() {
	s.mu.Lock()
	fns := s.fns
	s.fns = nil
	s.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// Proc is one child process; its output goes to a log file. The Cleaner
// kills it, and so does the death of this process (PDEATHSIG).
//
// This mirrors interop/matrix's proc (a separate Go module, so the small
// amount of code is duplicated rather than shared).
type Proc struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	st   *os.ProcessState
}

// Start starts bin in ns.
func Start(c Cleaner, ns *NS, name, bin string, args []string, log string, env ...string) (*Proc, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fmt.Fprintf(f, "### %s: %s %s\n", ns, bin, strings.Join(args, " "))
	cmd := ns.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %v", name, err)
	}
	p := &Proc{Name: name, Log: log, cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		p.mu.Lock()
		p.st = cmd.ProcessState
		p.mu.Unlock()
		close(p.done)
	}()
	c.Cleanup(p.Kill)
	return p, nil
}

// Pid is the process id (the program's own, also when started through
// `ip netns exec`).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

var sigterm = syscall.SIGTERM

func (p *Proc) waitExit(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// Kill ends the process with SIGKILL and reaps it.
func (p *Proc) Kill() {
	if p.Running() {
		p.cmd.Process.Signal(syscall.SIGKILL)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

// Stop sends SIGTERM and waits up to d for the exit, then kills.
func (p *Proc) Stop(d time.Duration) error {
	if !p.Running() {
		return fmt.Errorf("%s had already exited (%s)", p.Name, p.Status())
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(d):
		p.Kill()
		return fmt.Errorf("%s did not exit within %v of SIGTERM; killed", p.Name, d)
	}
}

func (p *Proc) Status() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.st == nil {
		return "running"
	}
	return p.st.String()
}

// Tail is the end of the log, for failure messages.
func (p *Proc) Tail(lines int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return fmt.Sprintf("--- %s (%s), last %d lines of %s ---\n%s", p.Name, p.Status(), len(all), p.Log, strings.Join(all, "\n"))
}

// OpenFDs counts the process's open file descriptors.
func (p *Proc) OpenFDs() (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.Pid()))
	if err != nil {
		return 0, err
	}
	return len(ents), nil
}

// Poll calls check every 50 ms until it succeeds or d passes.
func Poll(d time.Duration, what string, check func() error) error {
	return PollProc(d, what, nil, check)
}

// PollProc is Poll that also gives up when p exits.
func PollProc(d time.Duration, what string, p *Proc, check func() error) error {
	end := time.Now().Add(d)
	var last error
	for {
		if p != nil && !p.Running() {
			return fmt.Errorf("waiting for %s: %s ended (%s)", what, p.Name, p.Status())
		}
		if last = check(); last == nil {
			return nil
		}
		if !time.Now().Before(end) {
			return fmt.Errorf("waiting for %s: not within %v: %v", what, d, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
