//! Command-line flags that parse like upstream's (cobra + pflag).
//!
//! konn's binaries replace Go binaries that are configured by Kubernetes
//! manifests, so their command lines must mean exactly what they mean to
//! upstream. Upstream registers its flags with pflag (plus klog's flags
//! through Go's `flag` package) on a cobra command; this module reproduces
//! that parser instead of using a general-purpose Rust one, whose syntax
//! differs in the corners manifests reach (`docs/FLAGS.md` explains why):
//!
//! - `--flag=value` and `--flag value`; for booleans `--flag` alone means
//!   true and `--flag value` does *not* take `value` (it becomes a positional
//!   argument, as in pflag); `--flag=false` to turn one off.
//! - A flag repeated: the last occurrence wins, except string slices, which
//!   append (pflag).
//! - One-letter flags also work with one dash (`-v 4`, `-v=4`, `-v4`); `-h`
//!   and `--help` ask for help.
//! - `--` ends the flags; positional arguments are collected, not rejected
//!   (cobra ignores them for these commands).
//! - Deprecated flags are accepted; each use yields the warning line pflag
//!   prints (`Flag --x has been deprecated, …`). Hidden flags are accepted
//!   and left out of `--help`.
//! - Errors use pflag's words: `unknown flag: --foo`, `flag needs an
//!   argument: --port`, `invalid argument "x" for "--port" flag: …`.
//!
//! Values are Go-typed ([`value`]): `int` is Go's `int` with base prefixes,
//! durations use Go's syntax ([`go::GoDuration`]), bools Go's spellings.
//!
//! `--help` prints a cobra-like page whose flag listing is pflag's format
//! (name, type, usage, `(default …)`); konn's own flags are listed in a
//! [`Section::Konn`] of their own so nobody mistakes them for upstream's.
//!
//! [`engine`] holds the konn flags both binaries share; [`common`] what
//! their upstream flags have in common (shared flags, validation rules,
//! their error type, the not-yet-supported notice).

pub mod common;
pub mod engine;
pub mod go;
pub mod value;

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;

pub use go::GoDuration;
pub use value::{
    BoolValue, ByteSizeValue, ChoiceValue, DurationValue, Float32Value, IntValue, StringSliceValue,
    StringValue, Value,
};

/// Which `--help` section a flag is listed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Section {
    /// Upstream's flags (its own and klog's), same names and meaning.
    Upstream,
    /// Flags only konn has.
    Konn,
}

/// One registered flag.
#[derive(Debug)]
pub struct Flag {
    name: String,
    shorthand: Option<char>,
    usage: String,
    value: Box<dyn Value>,
    default: String,
    hidden: bool,
    deprecated: Option<String>,
    changed: bool,
    section: Section,
}

impl Flag {
    /// Long name, without dashes.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One-letter form (`-v`), if any.
    pub fn shorthand(&self) -> Option<char> {
        self.shorthand
    }

    /// Usage text.
    pub fn usage(&self) -> &str {
        &self.usage
    }

    /// The default as pflag renders it (`String()` at registration).
    pub fn default_text(&self) -> &str {
        &self.default
    }

    /// pflag's type name (`int`, `duration`, `stringSlice`, …).
    pub fn type_name(&self) -> &'static str {
        self.value.type_name()
    }

    /// The current value, rendered.
    pub fn value_text(&self) -> String {
        self.value.render()
    }

    /// The value object (for typed access, see [`FlagSet::value`]).
    pub fn value(&self) -> &dyn Value {
        self.value.as_ref()
    }

    /// Left out of `--help`.
    pub fn is_hidden(&self) -> bool {
        self.hidden
    }

    /// The deprecation message, if the flag is deprecated.
    pub fn deprecation(&self) -> Option<&str> {
        self.deprecated.as_deref()
    }

    /// Set on the command line at least once.
    pub fn is_changed(&self) -> bool {
        self.changed
    }

    /// The `--help` section.
    pub fn section(&self) -> Section {
        self.section
    }

    /// Marks the flag hidden (accepted, not listed in `--help`).
    pub fn hide(&mut self) -> &mut Self {
        self.hidden = true;
        self
    }

    /// Marks the flag deprecated, like pflag's `MarkDeprecated`: hidden,
    /// and every use produces `Flag --name has been deprecated, <message>`.
    pub fn deprecate(&mut self, message: &str) -> &mut Self {
        self.hidden = true;
        self.deprecated = Some(message.to_owned());
        self
    }

    /// Records the one-letter form; [`FlagSet::set_shorthand`] keeps the
    /// letters unique.
    fn set_shorthand(&mut self, c: char) {
        self.shorthand = Some(c);
    }

    /// How errors name the flag: `--name` or `-v, --v`.
    fn display_name(&self) -> String {
        match self.shorthand {
            Some(c) => format!("-{c}, --{}", self.name),
            None => format!("--{}", self.name),
        }
    }
}

/// A command-line parse error, worded as pflag words it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// `--name` is not a flag of this program.
    UnknownFlag(String),
    /// `-c` is not a one-letter flag of this program; `group` is the
    /// argument it appeared in (without the dash).
    UnknownShorthand {
        /// The letter.
        c: char,
        /// The argument, without its leading dash.
        group: String,
    },
    /// `--name` needs a value and none followed.
    MissingValue(String),
    /// `-c` needs a value and none followed.
    MissingShorthandValue {
        /// The letter.
        c: char,
        /// The argument, without its leading dash.
        group: String,
    },
    /// The value does not parse as the flag's type.
    InvalidValue {
        /// `--name`, or `-v, --v` for flags with a one-letter form.
        flag: String,
        /// The value given.
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// An argument like `---x` or `--=x`.
    BadSyntax(String),
    /// An argument that is not valid UTF-8 (pflag would take the bytes;
    /// konn's flags are all text).
    NotUtf8(String),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownFlag(name) => write!(f, "unknown flag: --{name}"),
            Self::UnknownShorthand { c, group } => {
                write!(f, "unknown shorthand flag: '{c}' in -{group}")
            }
            Self::MissingValue(name) => write!(f, "flag needs an argument: --{name}"),
            Self::MissingShorthandValue { c, group } => {
                write!(f, "flag needs an argument: '{c}' in -{group}")
            }
            Self::InvalidValue {
                flag,
                value,
                reason,
            } => write!(
                f,
                "invalid argument {} for {} flag: {reason}",
                go::quote(value),
                go::quote(flag)
            ),
            Self::BadSyntax(arg) => write!(f, "bad flag syntax: {arg}"),
            Self::NotUtf8(arg) => write!(f, "argument is not valid UTF-8: {arg}"),
        }
    }
}

impl std::error::Error for ParseError {}

/// What a successful parse found besides the flag values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Positional arguments, in order (after `--` included).
    pub args: Vec<String>,
    /// Warning lines to print on stderr, one per use of a deprecated flag.
    pub warnings: Vec<String>,
    /// `-h`/`--help` was given (the caller prints help and exits 0).
    pub help: bool,
}

/// A set of flags, parsed like a pflag `FlagSet`.
#[derive(Debug)]
pub struct FlagSet {
    name: String,
    flags: Vec<Flag>,
    by_name: HashMap<String, usize>,
    by_shorthand: HashMap<char, usize>,
    section: Section,
}

impl FlagSet {
    /// An empty set; `name` is the program name used in help.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            flags: Vec::new(),
            by_name: HashMap::new(),
            by_shorthand: HashMap::new(),
            section: Section::Upstream,
        }
    }

    /// The program name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `--help` section flags added now go to.
    pub fn section(&self) -> Section {
        self.section
    }

    /// Flags added from now on go to this `--help` section.
    pub fn set_section(&mut self, section: Section) {
        self.section = section;
    }

    /// Adds a flag with any [`Value`]; its current value is the default.
    ///
    /// # Panics
    ///
    /// If a flag of that name exists: flag names are fixed at compile time,
    /// so this is a programming error (tests catch it), never input.
    pub fn add(&mut self, name: &str, usage: &str, value: impl Value) -> &mut Flag {
        assert!(
            !self.by_name.contains_key(name),
            "flag --{name} registered twice"
        );
        let default = value.render();
        self.by_name.insert(name.to_owned(), self.flags.len());
        self.flags.push(Flag {
            name: name.to_owned(),
            shorthand: None,
            usage: usage.to_owned(),
            value: Box::new(value),
            default,
            hidden: false,
            deprecated: None,
            changed: false,
            section: self.section,
        });
        let last = self.flags.len() - 1;
        &mut self.flags[last]
    }

    /// Adds a `bool` flag.
    pub fn add_bool(&mut self, name: &str, default: bool, usage: &str) -> &mut Flag {
        self.add(name, usage, BoolValue(default))
    }

    /// Adds a `string` flag.
    pub fn add_string(&mut self, name: &str, default: &str, usage: &str) -> &mut Flag {
        self.add(name, usage, StringValue(default.to_owned()))
    }

    /// Adds an `int` flag (Go `int`).
    pub fn add_int(&mut self, name: &str, default: i64, usage: &str) -> &mut Flag {
        self.add(name, usage, IntValue(default))
    }

    /// Adds a `float32` flag.
    pub fn add_float32(&mut self, name: &str, default: f32, usage: &str) -> &mut Flag {
        self.add(name, usage, Float32Value(default))
    }

    /// Adds a `duration` flag.
    pub fn add_duration(&mut self, name: &str, default: GoDuration, usage: &str) -> &mut Flag {
        self.add(name, usage, DurationValue(default))
    }

    /// Adds a `stringSlice` flag.
    pub fn add_string_slice(&mut self, name: &str, default: &[&str], usage: &str) -> &mut Flag {
        self.add(name, usage, StringSliceValue::new(default.iter().copied()))
    }

    /// Gives flag `name` the one-letter form `c`.
    ///
    /// # Panics
    ///
    /// If `name` is unknown or `c` is taken (programming errors).
    pub fn set_shorthand(&mut self, name: &str, c: char) {
        let idx = self.index(name);
        assert!(
            !self.by_shorthand.contains_key(&c),
            "shorthand -{c} registered twice"
        );
        self.by_shorthand.insert(c, idx);
        self.flags[idx].set_shorthand(c);
    }

    fn index(&self, name: &str) -> usize {
        match self.by_name.get(name) {
            Some(&i) => i,
            None => panic!("flag --{name} is not registered"),
        }
    }

    /// The flag called `name`.
    pub fn lookup(&self, name: &str) -> Option<&Flag> {
        self.by_name.get(name).map(|&i| &self.flags[i])
    }

    /// The flag called `name`, for changing its registration.
    pub fn lookup_mut(&mut self, name: &str) -> Option<&mut Flag> {
        self.by_name.get(name).map(|&i| &mut self.flags[i])
    }

    /// All flags, sorted by name (pflag's order).
    pub fn flags(&self) -> Vec<&Flag> {
        let mut all: Vec<&Flag> = self.flags.iter().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Typed access to a flag's value.
    ///
    /// # Panics
    ///
    /// If `name` is unknown or its value is not a `T`: both are programming
    /// errors, caught by the option structs' tests.
    pub fn value<T: Value>(&self, name: &str) -> &T {
        let flag = &self.flags[self.index(name)];
        match flag.value.as_any().downcast_ref::<T>() {
            Some(v) => v,
            None => panic!(
                "flag --{name} is a {}, not the requested type",
                flag.value.type_name()
            ),
        }
    }

    /// A `bool` flag's value.
    pub fn get_bool(&self, name: &str) -> bool {
        self.value::<BoolValue>(name).0
    }

    /// A `string` flag's value.
    pub fn get_string(&self, name: &str) -> String {
        self.value::<StringValue>(name).0.clone()
    }

    /// An `int` flag's value.
    pub fn get_int(&self, name: &str) -> i64 {
        self.value::<IntValue>(name).0
    }

    /// A `float32` flag's value.
    pub fn get_float32(&self, name: &str) -> f32 {
        self.value::<Float32Value>(name).0
    }

    /// A `duration` flag's value.
    pub fn get_duration(&self, name: &str) -> GoDuration {
        self.value::<DurationValue>(name).0
    }

    /// A `stringSlice` flag's value.
    pub fn get_string_slice(&self, name: &str) -> Vec<String> {
        self.value::<StringSliceValue>(name).values.clone()
    }

    /// A [`ChoiceValue`] flag's value.
    pub fn get_choice(&self, name: &str) -> String {
        self.value::<ChoiceValue>(name).value.clone()
    }

    /// A [`ByteSizeValue`] flag's value.
    pub fn get_byte_size(&self, name: &str) -> u64 {
        self.value::<ByteSizeValue>(name).0
    }

    /// Was `name` given on the command line?
    pub fn changed(&self, name: &str) -> bool {
        self.lookup(name).is_some_and(Flag::is_changed)
    }

    /// Sets flag `name` as if `--name=value` had been given (pflag's
    /// `FlagSet.Set`). Returns the deprecation warning line for a
    /// deprecated flag.
    ///
    /// # Errors
    ///
    /// [`ParseError::UnknownFlag`] or [`ParseError::InvalidValue`].
    pub fn set(&mut self, name: &str, value: &str) -> Result<Option<String>, ParseError> {
        let idx = self
            .by_name
            .get(name)
            .copied()
            .ok_or_else(|| ParseError::UnknownFlag(name.to_owned()))?;
        self.set_index(idx, value)
    }

    /// Stores `value` in flag `idx`; returns the deprecation warning if any.
    fn set_index(&mut self, idx: usize, value: &str) -> Result<Option<String>, ParseError> {
        let flag = &mut self.flags[idx];
        flag.value
            .set(value)
            .map_err(|reason| ParseError::InvalidValue {
                flag: flag.display_name(),
                value: value.to_owned(),
                reason,
            })?;
        flag.changed = true;
        Ok(flag
            .deprecated
            .as_ref()
            .map(|msg| format!("Flag --{} has been deprecated, {msg}", flag.name)))
    }

    /// Parses `args` (without the program name) into the flags.
    ///
    /// `-h`/`--help` set [`Parsed::help`] when no `help` flag is registered
    /// (pflag's behaviour); [`Command`] registers one, as cobra does.
    ///
    /// # Errors
    ///
    /// The first bad argument, as a [`ParseError`]; flags before it keep the
    /// values already parsed.
    pub fn parse<I, S>(&mut self, args: I) -> Result<Parsed, ParseError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let args: Vec<String> = args.into_iter().map(Into::into).collect();
        let mut parsed = Parsed::default();
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            i += 1;
            if arg.len() < 2 || !arg.starts_with('-') {
                parsed.args.push(arg.clone());
                continue;
            }
            if arg == "--" {
                parsed.args.extend(args[i..].iter().cloned());
                break;
            }
            let outcome = if let Some(long) = arg.strip_prefix("--") {
                self.parse_long(arg, long, &args, &mut i, &mut parsed)
            } else {
                self.parse_short(&arg[1..], &args, &mut i, &mut parsed)
            };
            match outcome {
                Ok(Step::Continue) => {}
                Ok(Step::Help) => {
                    parsed.help = true;
                    return Ok(parsed);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(parsed)
    }

    fn parse_long(
        &mut self,
        arg: &str,
        body: &str,
        args: &[String],
        next: &mut usize,
        parsed: &mut Parsed,
    ) -> Result<Step, ParseError> {
        if body.is_empty() || body.starts_with(['-', '=']) {
            return Err(ParseError::BadSyntax(arg.to_owned()));
        }
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        let Some(&idx) = self.by_name.get(name) else {
            if name == "help" {
                return Ok(Step::Help);
            }
            return Err(ParseError::UnknownFlag(name.to_owned()));
        };
        let value = if let Some(v) = inline {
            v.to_owned()
        } else if self.flags[idx].value.is_bool() {
            "true".to_owned()
        } else if let Some(v) = args.get(*next) {
            // pflag takes the next argument whatever it looks like.
            *next += 1;
            v.clone()
        } else {
            return Err(ParseError::MissingValue(name.to_owned()));
        };
        if let Some(w) = self.set_index(idx, &value)? {
            parsed.warnings.push(w);
        }
        Ok(Step::Continue)
    }

    fn parse_short(
        &mut self,
        group: &str,
        args: &[String],
        next: &mut usize,
        parsed: &mut Parsed,
    ) -> Result<Step, ParseError> {
        let mut rest = group;
        while let Some(c) = rest.chars().next() {
            let after = &rest[c.len_utf8()..];
            let Some(&idx) = self.by_shorthand.get(&c) else {
                if c == 'h' {
                    return Ok(Step::Help);
                }
                return Err(ParseError::UnknownShorthand {
                    c,
                    group: group.to_owned(),
                });
            };
            let value = if let Some(v) = after.strip_prefix('=').filter(|_| after.len() > 1) {
                // -f=value
                rest = "";
                v.to_owned()
            } else if self.flags[idx].value.is_bool() {
                // -f, possibly followed by more letters
                rest = after;
                "true".to_owned()
            } else if !after.is_empty() {
                // -fvalue
                rest = "";
                after.to_owned()
            } else if let Some(v) = args.get(*next) {
                // -f value
                *next += 1;
                rest = "";
                v.clone()
            } else {
                return Err(ParseError::MissingShorthandValue {
                    c,
                    group: group.to_owned(),
                });
            };
            if let Some(w) = self.set_index(idx, &value)? {
                parsed.warnings.push(w);
            }
        }
        Ok(Step::Continue)
    }

    /// Every visible flag (and every hidden one that was set) as
    /// `--name=value`, sorted, separated by spaces; strings are quoted. For
    /// a start-up log line (upstream prints its options at `V(1)`); flag
    /// values are paths and settings, never secrets.
    pub fn summary(&self) -> String {
        self.flags()
            .into_iter()
            .filter(|f| !f.hidden || f.changed)
            .map(|f| {
                let v = f.value.render();
                if f.value.type_name() == "string" {
                    format!("--{}={}", f.name, go::quote(&v))
                } else {
                    format!("--{}={v}", f.name)
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// pflag's `FlagUsages()` for one section: one line per visible flag,
    /// sorted, aligned: `  -v, --v Level   usage (default 4)`.
    pub fn usage(&self, section: Section) -> String {
        let rows: Vec<(String, String)> = self
            .flags()
            .into_iter()
            .filter(|f| !f.hidden && f.section == section)
            .map(usage_row)
            .collect();
        let width = rows.iter().map(|(left, _)| left.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (left, right) in rows {
            // pflag pads to the longest left column plus three spaces.
            out.push_str(&left);
            out.push_str(&" ".repeat(width - left.len() + 3));
            out.push_str(&right.replace('\n', &format!("\n{}", " ".repeat(width + 3))));
            out.push('\n');
        }
        out
    }
}

/// Result of parsing one argument.
enum Step {
    Continue,
    Help,
}

/// pflag's `UnquoteUsage`: a back-quoted word in the usage names the
/// value (and loses its quotes); otherwise the type does.
fn unquote_usage(flag: &Flag) -> (String, String) {
    let usage = &flag.usage;
    if let Some(start) = usage.find('`')
        && let Some(len) = usage[start + 1..].find('`')
    {
        let name = &usage[start + 1..start + 1 + len];
        let text = format!("{}{name}{}", &usage[..start], &usage[start + 2 + len..]);
        return (name.to_owned(), text);
    }
    let name = match flag.value.type_name() {
        "bool" | "boolfunc" => "",
        "func" => "value",
        "float64" => "float",
        "int64" => "int",
        "uint64" => "uint",
        "stringSlice" => "strings",
        "intSlice" => "ints",
        "uintSlice" => "uints",
        "boolSlice" => "bools",
        other => other,
    };
    (name.to_owned(), usage.clone())
}

fn usage_row(flag: &Flag) -> (String, String) {
    let mut left = match flag.shorthand {
        Some(c) => format!("  -{c}, --{}", flag.name),
        None => format!("      --{}", flag.name),
    };
    let (var, mut usage) = unquote_usage(flag);
    if !var.is_empty() {
        left.push(' ');
        left.push_str(&var);
    }
    if !flag.value.default_is_zero(&flag.default) {
        if flag.value.type_name() == "string" {
            usage.push_str(&format!(" (default {})", go::quote(&flag.default)));
        } else {
            usage.push_str(&format!(" (default {})", flag.default));
        }
    }
    if let Some(msg) = &flag.deprecated {
        usage.push_str(&format!(" (DEPRECATED: {msg})"));
    }
    (left, usage)
}

/// A program's command line: its flags plus cobra's `-h, --help` and the
/// `--help` page.
#[derive(Debug)]
pub struct Command {
    about: String,
    flags: FlagSet,
}

/// What [`Command::parse`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Run the program.
    Run(Parsed),
    /// Print [`Command::help`] and exit 0.
    Help,
}

impl Command {
    /// A command called `name` (shown in usage) described by `about`, with
    /// the help flag registered.
    pub fn new(name: &str, about: &str) -> Self {
        let mut flags = FlagSet::new(name);
        flags.add_bool("help", false, &format!("help for {name}"));
        flags.set_shorthand("help", 'h');
        Self {
            about: about.to_owned(),
            flags,
        }
    }

    /// The flags, for registering and reading.
    pub fn flags(&self) -> &FlagSet {
        &self.flags
    }

    /// The flags, for registering.
    pub fn flags_mut(&mut self) -> &mut FlagSet {
        &mut self.flags
    }

    /// Parses `args` (without the program name). As in cobra, a parse error
    /// wins over `--help`, and `--help=false` runs the program.
    ///
    /// # Errors
    ///
    /// The first bad argument.
    pub fn parse<I, S>(&mut self, args: I) -> Result<Outcome, ParseError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let parsed = self.flags.parse(args)?;
        if parsed.help || self.flags.get_bool("help") {
            return Ok(Outcome::Help);
        }
        Ok(Outcome::Run(parsed))
    }

    /// The `--help` page: description, usage line, upstream-compatible flags,
    /// then konn's own flags.
    pub fn help(&self) -> String {
        let name = self.flags.name();
        let mut out = format!(
            "{}\n\nUsage:\n  {name} [flags]\n\nFlags:\n{}",
            self.about,
            self.flags.usage(Section::Upstream)
        );
        let konn = self.flags.usage(Section::Konn);
        if !konn.is_empty() {
            out.push_str("\nkonn flags (konn only; upstream Konnectivity does not have these):\n");
            out.push_str(&konn);
        }
        out
    }

    /// Parses the process arguments the way the binaries need it: prints
    /// `--help` to stdout and exits 0; prints a parse error as one line
    /// (`Error: unknown flag: --foo`) and exits 1; prints deprecation
    /// warnings to stderr; returns the positional arguments.
    pub fn parse_or_exit(&mut self, args: impl IntoIterator<Item = OsString>) -> Vec<String> {
        let mut strings = Vec::new();
        for arg in args {
            match arg.into_string() {
                Ok(s) => strings.push(s),
                Err(raw) => {
                    let err = ParseError::NotUtf8(raw.to_string_lossy().into_owned());
                    eprintln!("Error: {err}");
                    std::process::exit(1);
                }
            }
        }
        match self.parse(strings) {
            Ok(Outcome::Help) => {
                print!("{}", self.help());
                std::process::exit(0);
            }
            Ok(Outcome::Run(parsed)) => {
                for w in &parsed.warnings {
                    eprintln!("{w}");
                }
                parsed.args
            }
            Err(err) => {
                eprintln!("Error: {err}");
                std::process::exit(1);
            }
        }
    }
}

/// A random (version 4) UUID in its usual text form, for upstream's
/// `--server-id` / `--agent-id` defaults. Reads 16 bytes from the kernel
/// (`/dev/urandom`); `None` if that is impossible.
pub fn random_uuid() -> Option<String> {
    use std::io::Read as _;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .ok()?;
    b[6] = (b[6] & 0x0f) | 0x40; // version 4
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Some(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

#[cfg(test)]
mod tests;
