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

GradientStream::GradientStream(EngineState& s) : s_(s), store_(gradient_store(s), s.config.gradient_faults) {
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
  holder_.assign(ring_.size(), Holder{});
}

int GradientStream::slot_of_locked(const Unit& u) const {
  for (std::size_t i = 0; i < holder_.size(); ++i)
    if (holder_[i].unit == static_cast<std::int64_t>(u.index)) return static_cast<int>(i);
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
        if (holder_[i].unit < 0) return (free_slot = static_cast<int>(i)) >= 0;
      return false;
    });
    holder_[static_cast<std::size_t>(free_slot)] = Holder{static_cast<std::int64_t>(u.index), open_ ? open_for_ : 0, false};
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
  if (!bytes_[u.index]) return;  // several ranks: this rank keeps nothing of a small unit (an empty shard)
  // A wait, not host work: the disk's meter counts the transfer (GradWrite on the gradients' queue).
  store_.write(tensor_[u.index], g, 0, bytes_[u.index])->wait();
}

void GradientStream::reduced_locked(const Unit& u) {
  const int k = slot_of_locked(u);
  if (k < 0) return;
  Holder& h = holder_[static_cast<std::size_t>(k)];
  h.filled = true;
  // No speculation reads it: free at once. Nor does one read a unit of which this rank updates no
  // sub-group (several ranks: an empty shard of the optimizer states; its slot would be held until
  // the walk ends, and the walk would stop when it needs that slot).
  if (!open_ || h.gen != open_for_ || !u.state_range.len()) h = Holder{};
}

char* GradientStream::input(const Unit& u) {
  std::unique_lock<std::mutex> lk(s_.mu);
  if (const int k = slot_of_locked(u); k >= 0) return static_cast<char*>(ring_[static_cast<std::size_t>(k)].data());
  // The second pass: the Reduce worker is drained and every slot is free (see the header).
  ZINF_CHECK(holder_[0].unit < 0);
  if (loaded_ != static_cast<std::int64_t>(u.index) && bytes_[u.index]) {
    lk.unlock();
    store_.read(tensor_[u.index], ring_[0].data(), 0, bytes_[u.index])->wait();  // GradRead (the disk's meter)
    lk.lock();
    loaded_ = static_cast<std::int64_t>(u.index);
  }
  return static_cast<char*>(ring_[0].data());
}

void GradientStream::open(std::uint64_t gen) {
  std::lock_guard<std::mutex> lk(s_.mu);
  open_ = true;
  open_for_ = gen;
}

bool GradientStream::held_locked(const Unit& u) const { return slot_of_locked(u) >= 0; }

bool GradientStream::blocked_locked(const Unit& u) const {
  if (!open_) return true;
  if (slot_of_locked(u) >= 0) return false;
  for (const Holder& h : holder_)
    if (h.unit < 0) return false;
  return true;
}

void GradientStream::consumed(const Unit& u) {
  {
    std::lock_guard<std::mutex> lk(s_.mu);
    const int k = slot_of_locked(u);
    if (k >= 0) holder_[static_cast<std::size_t>(k)] = Holder{};
  }
  s_.cv.notify_all();
}

void GradientStream::close_locked(std::uint64_t gen) {
  if (gen == open_for_) open_ = false;  // else the next step's speculation has opened it already
  // Only filled slots are freed: one the Reduce worker is filling stays its own until reduced_locked
  // frees it (the ring is closed for it then).
  for (Holder& h : holder_)
    if (h.unit >= 0 && h.gen == gen && h.filled) h = Holder{};
}

void GradientStream::failed(const Unit& u) {
  {
    std::lock_guard<std::mutex> lk(s_.mu);
    const int k = slot_of_locked(u);
    if (k >= 0) {
      const std::uint64_t gen = holder_[static_cast<std::size_t>(k)].gen;
      holder_[static_cast<std::size_t>(k)] = Holder{};  // never filled: nobody else frees it
      if (gen != 0) close_locked(gen);  // the speculation stops waiting (blocked_locked), its slots free
    }
  }
  s_.cv.notify_all();  // a Reduce waiting in acquire, a walk waiting for u
}

void GradientStream::close(std::uint64_t gen) {
  {
    std::lock_guard<std::mutex> lk(s_.mu);
    close_locked(gen);
  }
  s_.cv.notify_all();
}

}  // namespace zinf::offload::detail
