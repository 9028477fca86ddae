//! konn's observability flags (issue 17): the dial audit log
//! (`--audit-log-*`, named after kube-apiserver's) and the opt-in
//! per-destination byte metrics. Registered in konn's `--help` section;
//! kept apart from upstream's flags so other features' flags merge beside
//! them.

use std::path::{Path, PathBuf};

use konn_core::cli::FlagSet;
use konn_core::cli::common::FlagError;

use crate::audit::{AuditConfig, Sink};
use crate::error::Error;

/// The raw values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObserveFlags {
    /// `--audit-log-path` (`-`: stdout; empty: off).
    pub audit_log_path: String,
    /// `--audit-log-maxsize`, megabytes (0: never rotate).
    pub audit_log_maxsize: i64,
    /// `--audit-log-maxbackup`.
    pub audit_log_maxbackup: i64,
    /// `--audit-log-queue-size`, records per worker.
    pub audit_log_queue_size: i64,
    /// `--metrics-per-destination-limit` (0: off).
    pub metrics_per_destination_limit: i64,
}

/// Validated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObserveOptions {
    /// The audit log, when on.
    pub audit: Option<AuditConfig>,
    /// Destinations with their own byte series (0: none).
    pub per_destination_limit: usize,
}

impl Default for ObserveFlags {
    fn default() -> Self {
        Self {
            audit_log_path: String::new(),
            audit_log_maxsize: 100,
            audit_log_maxbackup: 5,
            audit_log_queue_size: 10_000,
            metrics_per_destination_limit: 0,
        }
    }
}

impl ObserveFlags {
    /// Registers the flags (the caller chooses the section).
    pub fn register(&self, f: &mut FlagSet) {
        f.add_string(
            "audit-log-path",
            &self.audit_log_path,
            "konn: write one JSON line per tunnelled connection at its end, and per refused or \
             failed dial, to this file ('-': standard output; empty: no audit log). Never payloads \
             or tokens; records that do not fit the queue are dropped and counted \
             (konn_audit_records_dropped_total), traffic is never held. docs/OPERATIONS.md.",
        );
        f.add_int(
            "audit-log-maxsize",
            self.audit_log_maxsize,
            "konn: megabytes the audit log file may reach before it is rotated to <path>.1 \
             (0: never rotated).",
        );
        f.add_int(
            "audit-log-maxbackup",
            self.audit_log_maxbackup,
            "konn: rotated audit log files kept (<path>.1 newest); older ones are deleted.",
        );
        f.add_int(
            "audit-log-queue-size",
            self.audit_log_queue_size,
            "konn: audit records each worker queues for the writer before it drops them.",
        );
        f.add_int(
            "metrics-per-destination-limit",
            self.metrics_per_destination_limit,
            "konn: count konn_destination_bytes_total for up to this many destinations (host:port), \
             the others under destination=\"other\". 0: no per-destination series.",
        );
    }

    /// Reads the values registered by [`ObserveFlags::register`].
    pub fn from_flags(f: &FlagSet) -> Self {
        Self {
            audit_log_path: f.get_string("audit-log-path"),
            audit_log_maxsize: f.get_int("audit-log-maxsize"),
            audit_log_maxbackup: f.get_int("audit-log-maxbackup"),
            audit_log_queue_size: f.get_int("audit-log-queue-size"),
            metrics_per_destination_limit: f.get_int("metrics-per-destination-limit"),
        }
    }

    /// Checks the values: counts not negative, the queue not empty, the
    /// audit file's directory present.
    pub fn validate(&self) -> Result<ObserveOptions, Error> {
        let count = |flag: &'static str, value: i64| {
            usize::try_from(value)
                .map_err(|_| Error::Flag(FlagError::NegativeCount { flag, value }))
        };
        let maxsize = count("audit-log-maxsize", self.audit_log_maxsize)?;
        let backups = count("audit-log-maxbackup", self.audit_log_maxbackup)?;
        let queue = count("audit-log-queue-size", self.audit_log_queue_size)?;
        let per_destination_limit = count(
            "metrics-per-destination-limit",
            self.metrics_per_destination_limit,
        )?;
        if queue == 0 {
            return Err(Error::Flag(FlagError::InvalidLabels {
                flag: "audit-log-queue-size",
                problem: "must be greater than 0".into(),
            }));
        }
        let sink = match self.audit_log_path.as_str() {
            "" => None,
            "-" => Some(Sink::Stdout),
            p => {
                let path = PathBuf::from(p);
                let dir = match path.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d,
                    _ => Path::new("."),
                };
                if let Err(source) = std::fs::metadata(dir) {
                    return Err(Error::Flag(FlagError::FileMissing {
                        flag: "audit-log-path",
                        path: p.to_owned(),
                        source,
                    }));
                }
                Some(Sink::File(path))
            }
        };
        Ok(ObserveOptions {
            audit: sink.map(|sink| AuditConfig {
                sink,
                max_size: (maxsize as u64).saturating_mul(1 << 20),
                max_backups: backups,
                queue,
            }),
            per_destination_limit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_off_and_values_are_checked() {
        let d = ObserveFlags::default().validate().unwrap();
        assert_eq!(d, ObserveOptions::default());
        let on = ObserveFlags {
            audit_log_path: "-".into(),
            metrics_per_destination_limit: 3,
            ..ObserveFlags::default()
        }
        .validate()
        .unwrap();
        assert_eq!(
            on.audit,
            Some(AuditConfig {
                sink: Sink::Stdout,
                max_size: 100 << 20,
                max_backups: 5,
                queue: 10_000,
            })
        );
        assert_eq!(on.per_destination_limit, 3);
        for bad in [
            ObserveFlags {
                audit_log_maxbackup: -1,
                ..ObserveFlags::default()
            },
            ObserveFlags {
                audit_log_queue_size: 0,
                ..ObserveFlags::default()
            },
            ObserveFlags {
                audit_log_path: "/no/such/dir/audit.log".into(),
                ..ObserveFlags::default()
            },
        ] {
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains("--audit-log"), "{e}");
        }
    }
}
