//! hyper's tasks on the worker's own thread, for HTTP/2 both ways.

/// Runs the tasks hyper spawns (an HTTP/2 connection's streams, a backend connection's driver)
/// on the worker's single-threaded runtime: a worker is one pinned thread, and the state a
/// stream touches (`Rc`s of the route and the pools) never leaves it.
#[derive(Clone, Copy)]
pub struct LocalExec;

impl<F: std::future::Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}
