// Command reusable drives proxy-server the way konnectivity-client's
// reusable tunnel does (v0.37: CreateGRPCTunnel — one HTTP/2 connection,
// one Proxy stream per dial, many dials at once): it opens -tunnels such
// connections over the server's Unix socket and, on each, -dials
// concurrent dials spread over the -targets (echo servers), writes -size
// patterned bytes on each and checks the echo.
//
// It is its own module so that the interop matrix keeps building
// upstream's v0.36 server and agent with the dependency versions of
// upstream's own go.mod.
//
// Output: one line "dials=N ok=M failed=F" and, for failures, up to five
// "error: ..." lines; the exit status is 1 when any dial failed.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

func main() {
	uds := flag.String("uds", "", "proxy-server's --uds-name")
	targets := flag.String("targets", "", "comma-separated host:port echo servers to dial")
	tunnels := flag.Int("tunnels", 4, "reusable tunnels (HTTP/2 connections)")
	dials := flag.Int("dials", 50, "concurrent dials per tunnel")
	size := flag.Int("size", 4096, "bytes echoed per dial")
	timeout := flag.Duration("timeout", 60*time.Second, "bound on the whole run")
	flag.Parse()
	if *uds == "" || *targets == "" {
		fmt.Fprintln(os.Stderr, "reusable: -uds and -targets are required")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	addrs := strings.Split(*targets, ",")

	var (
		mu     sync.Mutex
		ok     int
		errs   []string
		failed int
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		failed++
		if len(errs) < 5 {
			errs = append(errs, err.Error())
		}
	}
	var wg sync.WaitGroup
	for t := 0; t < *tunnels; t++ {
		tunnel, err := client.CreateGRPCTunnel(ctx, *uds,
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", *uds)
			}),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintf(os.Stderr, "reusable: tunnel %d: %v\n", t, err)
			os.Exit(1)
		}
		defer tunnel.Close()
		for d := 0; d < *dials; d++ {
			wg.Add(1)
			go func(t, d int) {
				defer wg.Done()
				addr := addrs[(t+d)%len(addrs)]
				if err := echo(ctx, tunnel, addr, pattern(t*1000+d, *size)); err != nil {
					fail(fmt.Errorf("tunnel %d dial %d to %s: %v", t, d, addr, err))
					return
				}
				mu.Lock()
				ok++
				mu.Unlock()
			}(t, d)
		}
	}
	wg.Wait()
	fmt.Printf("dials=%d ok=%d failed=%d\n", *tunnels**dials, ok, failed)
	for _, e := range errs {
		fmt.Printf("error: %s\n", e)
	}
	if failed > 0 {
		os.Exit(1)
	}
}

func echo(ctx context.Context, tunnel client.ReusableTunnel, addr string, data []byte) error {
	conn, err := tunnel.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	werr := make(chan error, 1)
	go func() {
		_, err := conn.Write(data)
		werr <- err
	}()
	got := make([]byte, len(data))
	if _, err := io.ReadFull(conn, got); err != nil {
		return fmt.Errorf("read: %v", err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %v", err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("echo differs")
	}
	return nil
}

func pattern(seed, n int) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}
