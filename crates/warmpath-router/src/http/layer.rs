//! The concerns riding on an answer's body as [`Layer`]s, stacked in a
//! tuple inside one [`Layered`] body: one box per answer, not one per concern.

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use tracing::Span;

/// One concern riding on an answer's body.
pub(crate) trait Layer {
    /// A frame was passed on.
    fn frame(&mut self, _frame: &Frame<Bytes>) {}
    /// The body ended: `complete` unless it failed or was dropped first.
    fn end(&mut self, _complete: bool) {}
    /// The span the inner body is polled in.
    fn span(&self) -> Option<&Span> {
        None
    }
}

impl<A: Layer, B: Layer> Layer for (A, B) {
    fn frame(&mut self, frame: &Frame<Bytes>) {
        self.0.frame(frame);
        self.1.frame(frame);
    }
    fn end(&mut self, complete: bool) {
        self.0.end(complete);
        self.1.end(complete);
    }
    fn span(&self) -> Option<&Span> {
        self.0.span().or_else(|| self.1.span())
    }
}

pin_project_lite::pin_project! {
    /// `inner` with its layers: told of each frame and, once, of the end.
    pub(crate) struct Layered<B, L: Layer> {
        #[pin]
        inner: B,
        layers: L,
        ended: bool,
    }

    impl<B, L: Layer> PinnedDrop for Layered<B, L> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if !*this.ended {
                this.layers.end(false);
            }
        }
    }
}

pub(crate) fn layered<B, L: Layer>(inner: B, layers: L) -> Layered<B, L> {
    Layered {
        inner,
        layers,
        ended: false,
    }
}

impl<B: HttpBody<Data = Bytes>, L: Layer> HttpBody for Layered<B, L> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let polled = {
            let _in = this.layers.span().map(Span::enter);
            this.inner.as_mut().poll_frame(cx)
        };
        // hyper may not poll a body whose length is reached: its last frame ends it.
        let complete = match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                this.layers.frame(frame);
                this.inner.is_end_stream().then_some(true)
            }
            Poll::Ready(end) => Some(end.is_none()), // `None`: done; else an error
            Poll::Pending => None,
        };
        if let Some(complete) = complete.filter(|_| !*this.ended) {
            *this.ended = true;
            this.layers.end(complete);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
