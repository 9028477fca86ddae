// Command grpcpeer is a grpc-go peer for konn's interop tests.
//
// It speaks the upstream Konnectivity services (AgentService/Connect and
// ProxyService/Proxy, through the stubs generated from the upstream protos)
// and, on every bidi stream, exchanges a deterministic Packet sequence with
// the other side (see internal/seq): it sends -count packets while
// receiving -count packets, and checks every received packet against the one
// the other side was supposed to send.
//
//	grpcpeer server [flags]   serve until -streams streams have finished
//	grpcpeer client [flags]   run one exchange per method, then exit
//
// The exit status is 0 only if every exchange matched; 1 on a mismatch or
// a gRPC failure, 2 on bad flags, 3 when the -timeout watchdog fires. A
// one-line summary goes to stdout, diagnostics to stderr.
//
// grpc-go runs with its defaults (64 KiB initial windows with BDP
// estimation, 4 MiB maximum received message) on purpose: that is what the
// upstream binaries and kube-apiserver use, so konn is tested against real
// grpc-go flow control.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"
)

// config holds the flags of both modes.
type config struct {
	mode       string
	tcp        string
	unix       string
	cert       string
	key        string
	ca         string
	serverName string
	count      int
	timeout    time.Duration
	// corruptAt alters outgoing packet corruptAt of every stream (a test
	// hook that checks mismatches are caught); -1 sends the true sequence.
	corruptAt int

	// server only
	readyFile string
	streams   int

	// client only
	methods []string

	// metadata: the client sends these, the server checks them
	agentID             string
	agentIdentifiers    string
	agentIdentifiersSet bool
	// metadata: the server sends these, the client checks them
	serverID    string
	serverCount int
}

func usage(fs *flag.FlagSet) func() {
	return func() {
		fmt.Fprintf(fs.Output(), "usage: grpcpeer server|client [flags]\n")
		fs.PrintDefaults()
	}
}

func parseFlags(args []string) (*config, error) {
	if len(args) < 1 || (args[0] != "server" && args[0] != "client") {
		return nil, errors.New("first argument must be \"server\" or \"client\"")
	}
	c := &config{mode: args[0]}
	fs := flag.NewFlagSet("grpcpeer "+c.mode, flag.ContinueOnError)
	fs.Usage = usage(fs)
	fs.StringVar(&c.tcp, "tcp", "", "server: TCP address to listen on with mTLS (e.g. 127.0.0.1:0); client: address to dial")
	fs.StringVar(&c.unix, "unix", "", "server: Unix socket path to listen on (no TLS); client: socket to dial")
	fs.StringVar(&c.cert, "cert", "", "PEM certificate (server: serving cert; client: client cert for mTLS)")
	fs.StringVar(&c.key, "key", "", "PEM private key for -cert")
	fs.StringVar(&c.ca, "ca", "", "PEM CA bundle (server: verifies client certs, required; client: verifies the server)")
	fs.StringVar(&c.serverName, "server-name", "", "client: name the server certificate must match (default: the -tcp host)")
	fs.IntVar(&c.count, "count", 10000, "packets sent and expected per stream, each way")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "hard deadline for the whole run")
	fs.IntVar(&c.corruptAt, "corrupt-at", -1, "test hook: alter this outgoing packet on every stream, so the peer must report a mismatch")
	fs.StringVar(&c.readyFile, "ready-file", "", "server: write the bound addresses here once listening")
	fs.IntVar(&c.streams, "streams", 1, "server: exit after this many streams have finished (0: never)")
	method := fs.String("method", "connect", "client: connect, proxy, or both (two concurrent streams on one connection)")
	fs.StringVar(&c.agentID, "agent-id", "", "client: agentid metadata to send on Connect; server: agentid required on Connect (empty: any single value)")
	fs.StringVar(&c.agentIdentifiers, "agent-identifiers", "", "client: agentidentifiers metadata to send on Connect; server: value required on Connect (when the flag is given)")
	fs.StringVar(&c.serverID, "server-id", "grpcpeer", "server: serverid header sent on Connect; client: serverid required on Connect")
	fs.IntVar(&c.serverCount, "server-count", 1, "server: servercount header sent on Connect; client: servercount required on Connect")
	if err := fs.Parse(args[1:]); err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "agent-identifiers" {
			c.agentIdentifiersSet = true
		}
	})
	switch *method {
	case "connect", "proxy":
		c.methods = []string{*method}
	case "both":
		c.methods = []string{"connect", "proxy"}
	default:
		return nil, fmt.Errorf("-method %q: want connect, proxy or both", *method)
	}
	if c.tcp == "" && c.unix == "" {
		return nil, errors.New("need -tcp and/or -unix")
	}
	if c.mode == "client" && c.tcp != "" && c.unix != "" {
		return nil, errors.New("client: give either -tcp or -unix")
	}
	if c.tcp != "" && (c.cert == "" || c.key == "" || c.ca == "") {
		return nil, errors.New("-tcp needs -cert, -key and -ca (mTLS)")
	}
	if c.count < 0 || c.timeout <= 0 {
		return nil, errors.New("-count must be >= 0 and -timeout > 0")
	}
	return c, nil
}

// tlsConfig builds the mTLS configuration of either side.
func (c *config) tlsConfig() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(c.cert, c.key)
	if err != nil {
		return nil, fmt.Errorf("load key pair: %w", err)
	}
	caPEM, err := os.ReadFile(c.ca)
	if err != nil {
		return nil, fmt.Errorf("read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", c.ca)
	}
	t := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if c.mode == "server" {
		// As upstream's agent and mTLS frontend listeners.
		t.ClientAuth = tls.RequireAndVerifyClientCert
		t.ClientCAs = pool
	} else {
		t.RootCAs = pool
		t.ServerName = c.serverName
		if t.ServerName == "" {
			host, _, err := net.SplitHostPort(c.tcp)
			if err != nil {
				return nil, fmt.Errorf("-tcp %q: %w", c.tcp, err)
			}
			t.ServerName = host
		}
	}
	return t, nil
}

func main() {
	c, err := parseFlags(os.Args[1:])
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "grpcpeer: %v\n", err)
		}
		os.Exit(2)
	}
	// The run can never hang: whatever is blocked, the process ends. The
	// gRPC contexts carry the same deadline, so this only fires if they
	// did not unblock something.
	time.AfterFunc(c.timeout+2*time.Second, func() {
		fmt.Fprintf(os.Stderr, "grpcpeer %s: deadline of %s exceeded, giving up\n", c.mode, c.timeout)
		os.Exit(3)
	})
	if c.mode == "server" {
		err = runServer(c)
	} else {
		err = runClient(c)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "grpcpeer %s: FAILED: %v\n", c.mode, err)
		os.Exit(1)
	}
}
