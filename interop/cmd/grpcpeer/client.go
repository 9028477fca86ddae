package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
	"sigs.k8s.io/apiserver-network-proxy/proto/agent"

	"konn.local/interop/internal/seq"
)

// runClient dials the server once and runs one exchange per requested
// method, concurrently on that one connection.
func runClient(c *config) error {
	target, creds, where, err := c.dialTarget()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("dial %s: %w", target, err)
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	results := make([]string, len(c.methods))
	errs := make([]error, len(c.methods))
	var wg sync.WaitGroup
	for i, name := range c.methods {
		wg.Go(func() {
			st, err := c.call(ctx, conn, name)
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", methods[name].path, err)
				return
			}
			results[i] = fmt.Sprintf("%s: %s", name, st)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Printf("grpcpeer client: OK over %s, %s\n", where, strings.Join(results, "; "))
	return nil
}

// dialTarget is the grpc target, transport credentials and a description.
func (c *config) dialTarget() (string, credentials.TransportCredentials, string, error) {
	if c.unix != "" {
		return "unix://" + c.unix, insecure.NewCredentials(), "unix " + c.unix, nil
	}
	tlsCfg, err := c.tlsConfig()
	if err != nil {
		return "", nil, "", err
	}
	return c.tcp, credentials.NewTLS(tlsCfg), "mTLS tcp " + c.tcp, nil
}

// call opens one stream of method name and runs the exchange on it. On
// Connect it sends the agent metadata and checks the server's headers.
func (c *config) call(ctx context.Context, conn *grpc.ClientConn, name string) (stats, error) {
	ctx, cancel := context.WithCancel(ctx)
	// Cancelling also unblocks the sending goroutine after a failure.
	defer cancel()
	var stream interface {
		packetStream
		Header() (metadata.MD, error)
		CloseSend() error
	}
	var err error
	if name == "connect" {
		ctx = metadata.AppendToOutgoingContext(ctx,
			"agentid", c.agentID, "agentidentifiers", c.agentIdentifiers)
		stream, err = agent.NewAgentServiceClient(conn).Connect(ctx)
	} else {
		stream, err = client.NewProxyServiceClient(conn).Proxy(ctx)
	}
	if err != nil {
		return stats{}, fmt.Errorf("open stream: %w", err)
	}
	hdr, err := stream.Header()
	if err != nil {
		return stats{}, fmt.Errorf("response headers: %w", err)
	}
	if err := c.checkHeaders(name, hdr); err != nil {
		// A server that refuses the call answers with trailers only (no
		// headers); its status says why, so report that first.
		if _, rerr := stream.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
			return stats{}, fmt.Errorf("%w (and %v)", rerr, err)
		}
		return stats{}, err
	}
	m := methods[name].seq
	return exchange(stream, c.count, seq.TagOf(m, seq.ClientToServer), seq.TagOf(m, seq.ServerToClient), c.corruptAt, stream.CloseSend)
}

// checkHeaders applies the agent's rule on Connect (exactly one serverid and
// one servercount) with the values the flags expect; Proxy carries neither.
func (c *config) checkHeaders(name string, hdr metadata.MD) error {
	ids, counts := hdr.Get("serverid"), hdr.Get("servercount")
	if name != "connect" {
		if len(ids) != 0 || len(counts) != 0 {
			return fmt.Errorf("unexpected Connect headers on Proxy: serverid %v servercount %v", ids, counts)
		}
		return nil
	}
	if len(ids) != 1 || ids[0] != c.serverID {
		return fmt.Errorf("serverid header %v, want [%q]", ids, c.serverID)
	}
	if want := strconv.Itoa(c.serverCount); len(counts) != 1 || counts[0] != want {
		return fmt.Errorf("servercount header %v, want [%q]", counts, want)
	}
	return nil
}
