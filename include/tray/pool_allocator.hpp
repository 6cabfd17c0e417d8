// tray::PoolAllocator<T>: a standard allocator that serves the nodes of node-based containers
// (std::list, std::map, std::set, std::unordered_map, ...) from tray::ObjectPool. Header-only.
//
// A node container allocates its nodes one at a time through the allocator rebound to its node
// type; those requests (n == 1) are taken from a pool of slots of the node's size and
// alignment. Anything else (n != 1, such as an unordered container's bucket array) goes to
// std::allocator, that is ::operator new.
//
// Sharing. The default and the sized constructor each make a new pool set; copies, rebound
// copies included, share it through a reference count, and two allocators compare equal exactly
// when they share one. The set, with all its pools, lives until the last allocator using it is
// destroyed. Node types of the same size and alignment share a pool. All three propagate traits
// are true, so a container takes its allocator along on copy assignment, move assignment and
// swap, and nodes always go back to the set they came from; a copy-constructed container shares
// its source's set.
//
// Thread safety: none. Containers whose allocators share a pool set must be used by one thread
// at a time (the reference count itself is atomic, so copying allocators across threads is fine).
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include "tray/object_pool.hpp"

namespace tray {
namespace pool_detail {

// Room for one node, which the container constructs inside it.
template <size_t Size, size_t Align>
struct alignas(Align) NodeSlot {
  NodeSlot() noexcept {}  // user-provided, so that ObjectPool::create() leaves the bytes alone
  std::byte bytes[Size];
};

// The pools behind one family of PoolAllocator copies: one per node size and alignment.
class NodePoolSet {
 public:
  explicit NodePoolSet(size_t nodes_per_chunk) : nodes_per_chunk_(nodes_per_chunk) {}
  NodePoolSet(const NodePoolSet&) = delete;
  NodePoolSet& operator=(const NodePoolSet&) = delete;

  template <size_t Size, size_t Align>
  ObjectPool<NodeSlot<Size, Align>>& pool() {
    // A container uses one or two node shapes, so a short linear scan beats any map.
    for (const Entry& entry : entries_) {
      if (entry.size == Size && entry.align == Align) {
        return static_cast<SizedPool<Size, Align>&>(*entry.pool).pool;
      }
    }
    auto created = std::make_unique<SizedPool<Size, Align>>(nodes_per_chunk_);
    auto& pool = created->pool;
    entries_.push_back({Size, Align, std::move(created)});
    return pool;
  }

  size_t live_nodes() const noexcept {
    size_t live = 0;
    for (const Entry& entry : entries_) live += entry.pool->live();
    return live;
  }

 private:
  struct AnyPool {
    virtual ~AnyPool() = default;
    virtual size_t live() const noexcept = 0;
  };
  template <size_t Size, size_t Align>
  struct SizedPool final : AnyPool {
    explicit SizedPool(size_t nodes_per_chunk) : pool(nodes_per_chunk, PoolPolicy::grow) {}
    size_t live() const noexcept override { return pool.size(); }
    ObjectPool<NodeSlot<Size, Align>> pool;
  };
  struct Entry {
    size_t size;
    size_t align;
    std::unique_ptr<AnyPool> pool;
  };

  std::vector<Entry> entries_;
  size_t nodes_per_chunk_;
};

}  // namespace pool_detail

template <class T>
class PoolAllocator {
 public:
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::false_type;

  static constexpr size_t kDefaultNodesPerChunk = 256;

  PoolAllocator() : PoolAllocator(kDefaultNodesPerChunk) {}
  // A new pool set whose pools start with room for `nodes_per_chunk` nodes (at least 1) and
  // double when full.
  explicit PoolAllocator(size_t nodes_per_chunk)
      : pools_(std::make_shared<pool_detail::NodePoolSet>(nodes_per_chunk)) {}

  // Copy only, no move: a moved-from container keeps its allocator and must still be usable.
  PoolAllocator(const PoolAllocator&) noexcept = default;
  PoolAllocator& operator=(const PoolAllocator&) noexcept = default;

  template <class U>
  PoolAllocator(const PoolAllocator<U>& other) noexcept : pools_(other.pools_) {}

  [[nodiscard]] T* allocate(size_t n) {
    if (n != 1) return std::allocator<T>().allocate(n);
    void* node = node_pool().create();
    if (node == nullptr) throw std::bad_alloc();
    return static_cast<T*>(node);
  }

  void deallocate(T* p, size_t n) noexcept {
    if (n != 1) return std::allocator<T>().deallocate(p, n);
    node_pool().destroy(reinterpret_cast<Node*>(static_cast<void*>(p)));
  }

  // Nodes of every type allocated through this allocator's pool set and not yet deallocated.
  size_t live_nodes() const noexcept { return pools_->live_nodes(); }

  template <class U>
  bool operator==(const PoolAllocator<U>& other) const noexcept {
    return pools_ == other.pools_;
  }

 private:
  template <class>
  friend class PoolAllocator;

  using Node = pool_detail::NodeSlot<sizeof(T), alignof(T)>;

  ObjectPool<Node>& node_pool() const { return pools_->pool<sizeof(T), alignof(T)>(); }

  std::shared_ptr<pool_detail::NodePoolSet> pools_;
};

}  // namespace tray
