//! Small socket helpers the drivers share.

use std::io;

use monoio::net::tcp::TcpOwnedReadHalf;

/// Wait until the read half of a split TCP stream has data (or EOF), without
/// committing a buffer: an idle connection then holds no read buffer.
#[allow(unsafe_code)]
pub async fn readable(rd: &TcpOwnedReadHalf) -> io::Result<()> {
    // SAFETY: monoio's split keeps the stream in an `Rc<UnsafeCell<_>>` shared
    // by the two halves and hands out `&mut` only inside their own read and
    // write calls. `readable` takes `&TcpStream` and only submits a readiness
    // poll on the shared fd — the same kind of concurrent access to the fd
    // that the split already allows between a read and a write. No `&mut` to
    // the stream exists while this shared reference lives, because this
    // half's reads are not issued until the returned future completes.
    let stream = unsafe { &*rd.0.get() };
    stream.readable(true).await
}
