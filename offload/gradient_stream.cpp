// gradient_stream.cpp — gradient streaming: the ring of pinned gradient slots and the NVMe copy of
// each unit's gradient (gradient_stream.h).
#include "gradient_stream.h"

namespace zinf::offload::detail {

namespace {
nvme::StoreOptions gradient_store(const EngineState& s) {
  nvme::StoreOptions o = s.config.optimizer_store;  // the optimizer's folder (and its disk meter)
  o.queue = "gradients", o.read_span = "GradRead", o.write_span = "GradWrite";
  return o;
}
}  // namespace

GradientStream::GradientStream(EngineState& s) : s_(s), store_(gradient_store(s)) {
  // The handoffs of the step graph this stage makes (dataflow.cpp, "gradient streaming").
  s.claim("Reduce(u)", "GradWrite(u)", Handoff::enqueued_after);  // written(): the slot is full, then the write
  s.claim("GradWrite(u)", "Reduce(u)", Handoff::host_wait);       // written() waits for the write's handle
  s.claim("GradWrite(u)", "GradRead(u)", Handoff::host_wait);     // ... and the barrier drains the Reduce worker
  s.claim("GradRead(u)", "Update(g)", Handoff::host_wait);        // input() waits for the read's handle
  s.claim("Update(g)", "GradRead(u)", Handoff::enqueued_after);   // input() reads the next unit after the last Update
  s.claim("Update(g)", "Reduce(u)", Handoff::version);            // holder_ under mu (consumed, close)
}

void GradientStream::add(Unit& u, const std::string& name) {
  const BufferSpec& b = s_.spec(Buffer::nvme_grad, u.index, Tier::nvme);
  if (tensor_.size() <= u.index) tensor_.resize(u.index + 1), bytes_.resize(u.index + 1);
  tensor_[u.index] = store_.add(name + ".grad", b.bytes);
  bytes_[u.index] = b.bytes;
}

void GradientStream::allocate() {
  const BufferSpec& b = s_.spec(Buffer::grad_ring, kShared, Tier::pinned);
  for (std::uint64_t i = 0; i < b.count; ++i) ring_.push_back(s_.pinned->acquire(b.bytes));
  holder_.assign(ring_.size(), -1);
}

int GradientStream::slot_of_locked(const Unit& u) const {
  for (std::size_t i = 0; i < holder_.size(); ++i)
    if (holder_[i] == static_cast<std::int64_t>(u.index)) return static_cast<int>(i);
  return -1;
}

void GradientStream::acquire(const Unit& u) {
  {
    std::unique_lock<std::mutex> lk(s_.mu);
    int free_slot = -1;
    // A slot is freed by the speculation (consumed, close) or by reduced_locked when the ring is closed;
    // the speculation closes the ring when every slot holds a unit it is not waiting for.
    s_.cv.wait(lk, [&] {
      for (std::size_t i = 0; i < holder_.size(); ++i)
        if (holder_[i] < 0) return (free_slot = static_cast<int>(i)) >= 0;
      return false;
    });
    holder_[static_cast<std::size_t>(free_slot)] = static_cast<std::int64_t>(u.index);
    if (free_slot == 0) loaded_ = -1;  // slot 0 no longer holds a unit read back
  }
  s_.cv.notify_all();  // a speculation waiting for this unit (blocked_locked) sees it held
}

void GradientStream::written(const Unit& u) {
  char* g;
  {
    std::lock_guard<std::mutex> lk(s_.mu);
    const int k = slot_of_locked(u);
    ZINF_CHECK(k >= 0);
    g = static_cast<char*>(ring_[static_cast<std::size_t>(k)].data());
  }
  const auto t0 = Clock::now();
  store_.write(tensor_[u.index], g, 0, bytes_[u.index])->wait();
  s_.add_host_time(t0, "GradWrite", static_cast<std::int64_t>(u.index));
}

void GradientStream::reduced_locked(const Unit& u) {
  if (open_) return;
  const int k = slot_of_locked(u);
  if (k >= 0) holder_[static_cast<std::size_t>(k)] = -1;
}

char* GradientStream::input(const Unit& u) {
  std::unique_lock<std::mutex> lk(s_.mu);
  if (const int k = slot_of_locked(u); k >= 0) return static_cast<char*>(ring_[static_cast<std::size_t>(k)].data());
  // The second pass: the Reduce worker is drained and every slot is free (see the header).
  ZINF_CHECK(holder_[0] < 0);
  if (loaded_ != static_cast<std::int64_t>(u.index)) {
    lk.unlock();
    const auto t0 = Clock::now();
    store_.read(tensor_[u.index], ring_[0].data(), 0, bytes_[u.index])->wait();
    s_.add_host_time(t0, "GradRead", static_cast<std::int64_t>(u.index));
    lk.lock();
    loaded_ = static_cast<std::int64_t>(u.index);
  }
  return static_cast<char*>(ring_[0].data());
}

void GradientStream::open() {
  std::lock_guard<std::mutex> lk(s_.mu);
  for (std::int64_t h : holder_) ZINF_CHECK(h < 0);
  open_ = true;
}

bool GradientStream::held_locked(const Unit& u) const { return slot_of_locked(u) >= 0; }

bool GradientStream::blocked_locked(const Unit& u) const {
  if (!open_) return true;
  if (slot_of_locked(u) >= 0) return false;
  for (std::int64_t h : holder_)
    if (h < 0) return false;
  return true;
}

void GradientStream::consumed(const Unit& u) {
  {
    std::lock_guard<std::mutex> lk(s_.mu);
    const int k = slot_of_locked(u);
    if (k >= 0) holder_[static_cast<std::size_t>(k)] = -1;
  }
  s_.cv.notify_all();
}

void GradientStream::close_locked() {
  open_ = false;
  // Only slots whose unit is reduced are freed: one the Reduce worker is filling stays its own until
  // reduced_locked frees it (the ring is closed then).
  for (std::size_t i = 0; i < holder_.size(); ++i)
    if (holder_[i] >= 0 && s_.units[static_cast<std::size_t>(holder_[i])].reduced) holder_[i] = -1;
}

void GradientStream::close() {
  {
    std::lock_guard<std::mutex> lk(s_.mu);
    close_locked();
  }
  s_.cv.notify_all();
}

}  // namespace zinf::offload::detail
