//! [`ServerFlags::register`]: upstream's flags, in upstream's order and with
//! its help texts, then konn's own section.

use konn_core::cli::FlagSet;
use konn_core::cli::common::register_profiling;

use super::{ServerFlags, WARN_ON_CHANNEL_LIMIT_DEPRECATION};

impl ServerFlags {
    /// Registers upstream's flags with `self`'s values as defaults.
    pub fn register(&self, f: &mut FlagSet) {
        f.add_string(
            "server-cert",
            &self.server_cert,
            "Certificate (PEM) the TCP frontend serves to kube-apiserver. Needs --server-key.",
        );
        f.add_string(
            "server-key",
            &self.server_key,
            "Private key (PEM) of --server-cert.",
        );
        f.add_string(
            "server-ca-cert",
            &self.server_ca_cert,
            "CA bundle (PEM) that kube-apiserver's client certificates must chain to. Required \
             when the frontend listens on TCP; not allowed with --uds-name.",
        );
        f.add_string(
            "cluster-cert",
            &self.cluster_cert,
            "Certificate (PEM) the agent port serves to proxy-agents.",
        );
        f.add_string(
            "cluster-key",
            &self.cluster_key,
            "Private key (PEM) of --cluster-cert.",
        );
        f.add_string(
            "cluster-ca-cert",
            &self.cluster_ca_cert,
            "CA bundle (PEM) that agents' client certificates must chain to (agent mTLS). Without \
             it and without token authentication, any TLS client can register as an agent.",
        );
        f.add_string(
            "mode",
            &self.mode,
            "Frontend protocol: 'grpc' (konnectivity-client) or 'http-connect' (HTTP CONNECT).",
        );
        f.add_string(
            "uds-name",
            &self.uds_name,
            "Unix socket path for the frontend. Empty: the frontend listens on TCP \
             (--server-port).",
        );
        f.add_bool(
            "delete-existing-uds-file",
            self.delete_existing_uds_file,
            "Remove a leftover socket file at --uds-name before listening.",
        );
        f.add_int(
            "server-port",
            self.server_port,
            "TCP port of the frontend (kube-apiserver side). Must be 0 with --uds-name.",
        );
        f.add_string(
            "server-bind-address",
            &self.server_bind_address,
            "Address the TCP frontend binds to. Empty: all interfaces.",
        );
        f.add_int(
            "agent-port",
            self.agent_port,
            "Port proxy-agents connect to (gRPC over TLS).",
        );
        f.add_string(
            "agent-bind-address",
            &self.agent_bind_address,
            "Address the agent port binds to. Empty: all interfaces.",
        );
        f.add_int(
            "admin-port",
            self.admin_port,
            "Port of the admin server (/metrics; profiling endpoints upstream).",
        );
        f.add_string(
            "admin-bind-address",
            &self.admin_bind_address,
            "Address the admin server binds to.",
        );
        f.add_int(
            "health-port",
            self.health_port,
            "Port of the health server (/healthz, /readyz, /metrics).",
        );
        f.add_string(
            "health-bind-address",
            &self.health_bind_address,
            "Address the health server binds to. Empty: all interfaces.",
        );
        f.add_duration(
            "keepalive-time",
            self.keepalive_time,
            "Idle time after which the agent port pings an agent's connection.",
        );
        f.add_duration(
            "frontend-keepalive-time",
            self.frontend_keepalive_time,
            "Idle time after which the gRPC frontend pings kube-apiserver's connection.",
        );
        register_profiling(f, self.enable_profiling, self.enable_contention_profiling);
        f.add_string(
            "server-id",
            &self.server_id,
            "This server's ID, sent to agents. Defaults to $PROXY_SERVER_ID, else a random UUID; \
             the flag wins over the variable.",
        );
        f.add_int(
            "server-count",
            self.server_count,
            "Number of proxy-server instances agents should connect to (1 unless the servers run \
             HA).",
        );
        f.add_string(
            "agent-namespace",
            &self.agent_namespace,
            "Agent token authentication: the agents' ServiceAccount namespace (with \
             --agent-service-account, --authentication-audience, --kubeconfig).",
        );
        f.add_string(
            "agent-service-account",
            &self.agent_service_account,
            "Agent token authentication: the agents' ServiceAccount name (with --agent-namespace, \
             --authentication-audience, --kubeconfig).",
        );
        f.add_string(
            "kubeconfig",
            &self.kubeconfig,
            "kubeconfig for the Kubernetes API client (token reviews, leases). Empty: in-cluster \
             configuration.",
        );
        f.add_float32(
            "kubeconfig-qps",
            self.kubeconfig_qps,
            "Queries per second allowed to the Kubernetes API client. 0: client default.",
        );
        f.add_int(
            "kubeconfig-burst",
            self.kubeconfig_burst,
            "Burst allowed to the Kubernetes API client. 0: client default.",
        );
        f.add_string(
            "kube-api-content-type",
            &self.kube_api_content_type,
            "Content type of requests to the Kubernetes API.",
        );
        f.add_string(
            "authentication-audience",
            &self.authentication_audience,
            "Agent token authentication: the audience the agents' tokens must carry (with \
             --agent-namespace, --agent-service-account, --kubeconfig).",
        );
        f.add_string(
            "proxy-strategies",
            &self.proxy_strategies,
            "Ordered, comma-separated strategies for choosing an agent: default (any), destHost \
             (an agent that registered the destination host), defaultRoute (an agent that \
             registered default-route). The first that finds an agent wins.",
        );
        let cipher_suites: Vec<&str> = self.cipher_suites.iter().map(String::as_str).collect();
        f.add_string_slice(
            "cipher-suites",
            &cipher_suites,
            "Comma-separated TLS 1.2 cipher suites (Go names). Empty: the defaults. No effect on \
             TLS 1.3.",
        );
        f.add_string(
            "tls-min-version",
            &self.tls_min_version,
            "Lowest TLS version accepted: VersionTLS10, VersionTLS11, VersionTLS12 or \
             VersionTLS13. Empty: VersionTLS12.",
        );
        f.add_int(
            "xfr-channel-size",
            self.xfr_channel_size,
            "Upstream: capacity of the per-stream packet channels, in packets; must be > 0. konn \
             bounds queues by --conn-queue-size and uses this only for its check.",
        );
        f.add_bool(
            "enable-lease-controller",
            self.enable_lease_controller,
            "Publish this server's Lease and remove expired ones, so agents can count servers \
             (needs the Kubernetes API).",
        );
        f.add_string(
            "lease-namespace",
            &self.lease_namespace,
            "Namespace of the server Leases.",
        );
        f.add_string(
            "lease-label",
            &self.lease_label,
            "Labels put on the server Leases, k=v[,k=v...].",
        );
        f.add_duration(
            "graceful-shutdown-timeout",
            self.graceful_shutdown_timeout,
            "On SIGTERM, let open connections finish for up to this long before stopping. 0: stop \
             at once.",
        );
        f.add_duration(
            "backend-dial-timeout",
            self.backend_dial_timeout,
            "Limit on sending a DIAL_REQ to an agent and receiving its DIAL_RSP. 0: konn's default \
             bound of 30s (upstream: no limit).",
        );
        f.add_bool(
            "warn-on-channel-limit",
            self.warn_on_channel_limit,
            "No effect.",
        )
        .deprecate(WARN_ON_CHANNEL_LIMIT_DEPRECATION);
        // konn's own (KEP-2025), in konn's --help section.
        let previous = f.section();
        f.set_section(konn_core::cli::Section::Konn);
        let allowed: Vec<&str> = self
            .allowed_destination
            .iter()
            .map(String::as_str)
            .collect();
        f.add_string_slice(
            "allowed-destination",
            &allowed,
            "konn: a control-plane destination host:port that agents may reach from the node network \
             (KEP-2025, proxy-agent --target). Agents must spell it exactly so; the server dials what \
             is configured here, never the agent's text. Repeatable. Empty: every reverse dial is \
             refused.",
        );
        f.add_int(
            "reverse-max-per-agent",
            self.reverse_max_per_agent,
            "konn: reverse dials in flight plus reverse connections open, per agent tunnel.",
        );
        f.add_int(
            "reverse-dial-rate",
            self.reverse_dial_rate,
            "konn: new reverse dials per second per agent tunnel (also the burst an idle agent may \
             start at once).",
        );
        f.add_duration(
            "reverse-dial-timeout",
            self.reverse_dial_timeout,
            "konn: bound on resolving and connecting one --allowed-destination.",
        );
        let l = &self.limits;
        let limits: [(&str, i64, &str); 8] = [
            (
                "max-agent-connections",
                l.agent_connections,
                "connections (and dials in flight) per agent (agentid)",
            ),
            (
                "max-agent-dial-rate",
                l.agent_dial_rate,
                "new dials per second per agent (also the burst)",
            ),
            (
                "max-destination-connections",
                l.destination_connections,
                "connections (and dials in flight) per destination host",
            ),
            (
                "max-destination-dial-rate",
                l.destination_dial_rate,
                "new dials per second per destination host (also the burst)",
            ),
            (
                "max-frontend-connections",
                l.frontend_connections,
                "connections (and dials in flight) per frontend identity (the user id of a Unix-socket client, the CN of a TCP client's certificate)",
            ),
            (
                "max-frontend-dial-rate",
                l.frontend_dial_rate,
                "new dials per second per frontend identity (also the burst)",
            ),
            (
                "max-cluster-connections",
                l.cluster_connections,
                "connections (and dials in flight) per cluster, all agents together",
            ),
            (
                "max-cluster-dial-rate",
                l.cluster_dial_rate,
                "new dials per second per cluster (also the burst)",
            ),
        ];
        for (name, value, what) in limits {
            f.add_int(
                name,
                value,
                &format!(
                    "konn: {what}; a dial over it is refused (gRPC: DIAL_RSP error, CONNECT: 503). \
                     0: no limit."
                ),
            );
        }
        f.add_float32(
            "overload-memory-watermark",
            l.overload_memory_watermark,
            "konn: a fraction of --memory-budget (0 < x <= 1); while pooled buffers in use exceed \
             it, new dials are refused (gRPC: DIAL_RSP error, CONNECT: 503) and established \
             connections keep flowing; dials are admitted again below 90% of it. 0: off.",
        );
        f.add_string(
            "clusters-config",
            &self.clusters_config,
            "konn: a YAML file of clusters served by this one server (docs/MULTI-CLUSTER.md): each \
             with its own frontend, its agents chosen by the SNI they send on the agent port and \
             admitted only with that cluster's credentials, its own strategies, limits and allowed \
             destinations. Re-read on SIGHUP and when it changes. Empty: one cluster, from the flags.",
        );
        f.add_duration(
            "connect-header-timeout",
            self.connect_header_timeout,
            "konn: an HTTP CONNECT request head must be complete this long after the connection is \
             accepted (TLS handshake included), or the connection is closed without an answer \
             (upstream: Go's 60 s ReadHeaderTimeout, fixed). 0 disables.",
        );
        self.observe.register(f);
        f.set_section(previous);
    }
}
