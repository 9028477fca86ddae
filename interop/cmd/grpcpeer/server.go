package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	"sigs.k8s.io/apiserver-network-proxy/proto/agent"

	"konn.local/interop/internal/seq"
)

// streamResult is one finished stream, as reported to runServer.
type streamResult struct {
	method string
	stats  stats
	err    error
}

// peerServer implements both upstream services with the same exchange.
type peerServer struct {
	c    *config
	done chan streamResult
}

// Connect is /AgentService/Connect: check the agent's metadata, send the
// serverid/servercount headers like upstream's server, then exchange.
func (s *peerServer) Connect(stream agent.AgentService_ConnectServer) error {
	if err := s.checkAgentMetadata(stream.Context()); err != nil {
		s.report("connect", stats{}, err)
		return status.Error(codes.InvalidArgument, err.Error())
	}
	hdr := metadata.Pairs("serverid", s.c.serverID, "servercount", strconv.Itoa(s.c.serverCount))
	if err := stream.SendHeader(hdr); err != nil {
		s.report("connect", stats{}, fmt.Errorf("send headers: %w", err))
		return err
	}
	return s.serve("connect", stream)
}

// Proxy is /ProxyService/Proxy: no metadata either way, like upstream.
func (s *peerServer) Proxy(stream client.ProxyService_ProxyServer) error {
	return s.serve("proxy", stream)
}

func (s *peerServer) serve(name string, stream packetStream) error {
	m := methods[name].seq
	st, err := exchange(stream, s.c.count, seq.TagOf(m, seq.ServerToClient), seq.TagOf(m, seq.ClientToServer), s.c.corruptAt, nil)
	s.report(name, st, err)
	if err != nil {
		return status.Error(codes.Aborted, err.Error())
	}
	return nil
}

func (s *peerServer) report(method string, st stats, err error) {
	s.done <- streamResult{method, st, err}
}

// checkAgentMetadata applies upstream's rules (exactly one agentid, at most
// one agentidentifiers) plus the exact values asked for by the flags.
func (s *peerServer) checkAgentMetadata(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	ids := md.Get("agentid")
	if len(ids) > 0 || s.c.agentID != "" {
		if len(ids) != 1 {
			return fmt.Errorf("expected one agent ID in the context, got %v", ids)
		}
		if s.c.agentID != "" && ids[0] != s.c.agentID {
			return fmt.Errorf("agentid %q, want %q", ids[0], s.c.agentID)
		}
	}
	idents := md.Get("agentidentifiers")
	if len(idents) > 1 {
		return fmt.Errorf("expected at most one agent identifiers value, got %v", idents)
	}
	if s.c.agentIdentifiersSet && (len(idents) != 1 || idents[0] != s.c.agentIdentifiers) {
		return fmt.Errorf("agentidentifiers %v, want [%q]", idents, s.c.agentIdentifiers)
	}
	return nil
}

// runServer serves on the requested listeners until -streams streams have
// finished, then stops gracefully. It fails if any stream failed.
func runServer(c *config) error {
	impl := &peerServer{c: c, done: make(chan streamResult, 16)}
	var servers []*grpc.Server
	var ready []string
	if c.tcp != "" {
		tlsCfg, err := c.tlsConfig()
		if err != nil {
			return err
		}
		lis, err := net.Listen("tcp", c.tcp)
		if err != nil {
			return err
		}
		srv := newGRPCServer(impl, grpc.Creds(credentials.NewTLS(tlsCfg)))
		servers = append(servers, srv)
		ready = append(ready, "tcp="+lis.Addr().String())
		go func() { _ = srv.Serve(lis) }()
	}
	if c.unix != "" {
		_ = os.Remove(c.unix)
		lis, err := net.Listen("unix", c.unix)
		if err != nil {
			return err
		}
		srv := newGRPCServer(impl)
		servers = append(servers, srv)
		ready = append(ready, "unix="+c.unix)
		go func() { _ = srv.Serve(lis) }()
	}
	fmt.Printf("grpcpeer server: listening on %s\n", strings.Join(ready, " "))
	if err := writeReadyFile(c.readyFile, ready); err != nil {
		return err
	}

	var failures []error
	var summary []string
	for n := 0; c.streams == 0 || n < c.streams; n++ {
		r := <-impl.done
		if r.err != nil {
			failures = append(failures, fmt.Errorf("%s stream: %w", r.method, r.err))
			fmt.Fprintf(os.Stderr, "grpcpeer server: %s stream FAILED: %v\n", r.method, r.err)
			continue
		}
		summary = append(summary, fmt.Sprintf("%s: %s", r.method, r.stats))
	}
	stopAll(servers, 5*time.Second)
	if len(failures) > 0 {
		return errors.Join(failures...)
	}
	fmt.Printf("grpcpeer server: OK, %d stream(s): %s\n", len(summary), strings.Join(summary, "; "))
	return nil
}

// newGRPCServer makes a server with grpc-go's defaults and both services.
func newGRPCServer(impl *peerServer, opts ...grpc.ServerOption) *grpc.Server {
	srv := grpc.NewServer(opts...)
	agent.RegisterAgentServiceServer(srv, impl)
	client.RegisterProxyServiceServer(srv, impl)
	return srv
}

// stopAll stops gracefully, or forcibly after grace (a peer that keeps its
// connection open must not keep this process alive).
func stopAll(servers []*grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		for _, s := range servers {
			s.GracefulStop()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		for _, s := range servers {
			s.Stop()
		}
	}
}

// writeReadyFile publishes the bound addresses atomically (write, rename),
// so a reader never sees a partial file.
func writeReadyFile(path string, lines []string) error {
	if path == "" {
		return nil
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
