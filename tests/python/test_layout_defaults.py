"""Layout objects own their lists (issue 11 item 8): a default argument or a
list passed in is copied, so changing one layout never changes another. No
Manager needed."""

from __future__ import annotations

import orbitkv


def test_group_layout_default_lists_are_not_shared():
    g = orbitkv.GroupLayout(slot_bytes=[64])
    g.slots.append(orbitkv.SlotLayout(slot_id=0, page_stride=64, bytes_per_page=64))
    g.slot_bytes.append(128)
    fresh = orbitkv.GroupLayout()
    assert fresh.slots == [] and fresh.slot_bytes == []
    other = orbitkv.GroupLayout()
    other.slots.append(orbitkv.SlotLayout())
    assert orbitkv.GroupLayout().slots == []


def test_instance_layout_default_lists_are_not_shared():
    layout = orbitkv.InstanceLayout(num_pages=4)
    layout.region_bytes.append(4096)
    layout.groups.append(orbitkv.GroupLayout(slot_bytes=[64]))
    fresh = orbitkv.InstanceLayout()
    assert fresh.region_bytes == [] and fresh.groups == []


def test_lists_passed_in_are_copied_and_attributes_stay_live():
    sizes = [64, 64]
    g = orbitkv.GroupLayout(slot_bytes=sizes)
    sizes.append(1)
    assert g.slot_bytes == [64, 64]
    # The attribute itself is the layout's own list: changing it changes the layout.
    g.slot_bytes.append(32)
    assert g.slot_bytes == [64, 64, 32]
    regions = [4096]
    layout = orbitkv.InstanceLayout(num_pages=1, region_bytes=regions, groups=[g])
    layout.region_bytes = regions
    regions.append(1)
    assert layout.region_bytes == [4096]
    a = orbitkv.split_layout(2, [64])
    b = orbitkv.split_layout(2, [64])
    a.groups[0].slots.append(orbitkv.SlotLayout(slot_id=1))
    assert len(b.groups[0].slots) == 1
