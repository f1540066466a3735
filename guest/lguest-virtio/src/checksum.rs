// SPDX-License-Identifier: GPL-2.0
//! The Internet checksum (RFC 1071) for the virtio-net offloads.
//!
//! - Receive: with `GUEST_CSUM` the device may hand over a frame whose
//!   TCP/UDP checksum holds only the pseudo-header sum
//!   (`VIRTIO_NET_HDR_F_NEEDS_CSUM`); [`complete_partial`] finishes it, so
//!   that the stack above can check it as usual.
//! - Transmit: with `CSUM` (and `HOST_TSO4`/`HOST_TSO6`) the driver leaves
//!   the TCP checksum to the device; [`prepare_tcp_offload`] writes the
//!   pseudo-header sum the device starts from and says where the checksum
//!   and the headers are.

/// Adds `data` to the running one's-complement sum `sum` (big-endian 16-bit
/// words; an odd last byte is padded with a zero). The result is not folded.
pub fn add(mut sum: u64, data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        // Add the two 32-bit halves: no 64-bit overflow for any frame.
        sum += (w >> 32) + (w & 0xffff_ffff);
    }
    let mut rest = chunks.remainder();
    while rest.len() >= 2 {
        sum += u64::from(u16::from_be_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
    }
    if let Some(&b) = rest.first() {
        sum += u64::from(b) << 8;
    }
    sum
}

/// Folds a running sum to 16 bits (not complemented).
pub fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The checksum of `data` (folded and complemented), as it is stored.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(add(0, data))
}

/// Finishes the partial checksum of a received frame: the one's-complement
/// sum of `frame[csum_start..]` (whose checksum field, at `csum_start +
/// csum_offset`, holds the pseudo-header sum) goes, complemented, into that
/// field. Returns false, changing nothing, if the offsets do not fit.
pub fn complete_partial(frame: &mut [u8], csum_start: usize, csum_offset: usize) -> bool {
    let at = csum_start.saturating_add(csum_offset);
    if csum_start >= frame.len() || at.saturating_add(2) > frame.len() {
        return false;
    }
    let sum = !fold(add(0, &frame[csum_start..]));
    frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    true
}

/// Ethernet header bytes.
pub const ETH_HLEN: usize = 14;
/// IPv6 header bytes (without extension headers).
const IPV6_HLEN: usize = 40;
/// IP protocol number of TCP.
const IPPROTO_TCP: u8 = 6;
/// Where the checksum is in a TCP header.
pub const TCP_CSUM_OFFSET: usize = 16;

/// Where things are in a TCP frame prepared for offload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpOffload {
    /// IPv6 (else IPv4).
    pub ipv6: bool,
    /// Offset of the TCP header (the checksum's start).
    pub csum_start: usize,
    /// Bytes of the Ethernet, IP and TCP headers.
    pub hdr_len: usize,
}

/// If `frame` (Ethernet) carries TCP over IPv4 or IPv6 (without extension
/// headers), writes into its TCP checksum field the folded sum of the
/// pseudo-header (addresses, protocol, TCP length), which is what a device
/// doing `NEEDS_CSUM` (and segmentation) starts from, and returns where the
/// headers are. Anything else (ARP, ICMP, UDP, a short or odd frame)
/// gives `None` and is left as it is.
pub fn prepare_tcp_offload(frame: &mut [u8]) -> Option<TcpOffload> {
    if frame.len() < ETH_HLEN + 20 {
        return None;
    }
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let (ipv6, ip_hlen, pseudo) = match ethertype {
        0x0800 => {
            let ip = &frame[ETH_HLEN..];
            let ihl = usize::from(ip[0] & 0xf) * 4;
            if ip[0] >> 4 != 4 || ihl < 20 || ip[9] != IPPROTO_TCP || ip.len() < ihl + 20 {
                return None;
            }
            // The TCP length from the IP total length (0 when it did not
            // fit: then from the frame).
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let total = if total == 0 { ip.len() } else { total.min(ip.len()) };
            let tcp_len = total.checked_sub(ihl)?;
            let mut s = add(0, &ip[12..20]);
            s += u64::from(IPPROTO_TCP) + tcp_len as u64;
            (false, ihl, s)
        }
        0x86dd => {
            let ip = &frame[ETH_HLEN..];
            if ip.len() < IPV6_HLEN + 20 || ip[0] >> 4 != 6 || ip[6] != IPPROTO_TCP {
                return None;
            }
            let payload = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            let payload = if payload == 0 { ip.len() - IPV6_HLEN } else { payload.min(ip.len() - IPV6_HLEN) };
            let mut s = add(0, &ip[8..40]);
            s += u64::from(IPPROTO_TCP) + payload as u64;
            (true, IPV6_HLEN, s)
        }
        _ => return None,
    };
    let csum_start = ETH_HLEN + ip_hlen;
    let doff = usize::from(frame[csum_start + 12] >> 4) * 4;
    if doff < 20 || csum_start + doff > frame.len() {
        return None;
    }
    let at = csum_start + TCP_CSUM_OFFSET;
    frame[at..at + 2].copy_from_slice(&fold(pseudo).to_be_bytes());
    Some(TcpOffload { ipv6, csum_start, hdr_len: csum_start + doff })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP/IPv4 frame with `payload`, checksums filled in properly.
    fn tcp4_frame(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[12] = 0x08;
        f[14] = 0x45;
        let total = (40 + payload.len()) as u16;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f[22] = 64;
        f[23] = 6;
        f[26..30].copy_from_slice(&[192, 168, 2, 2]);
        f[30..34].copy_from_slice(&[192, 168, 2, 1]);
        let ipsum = checksum(&f[14..34]);
        f[24..26].copy_from_slice(&ipsum.to_be_bytes());
        f[34..36].copy_from_slice(&1234u16.to_be_bytes());
        f[36..38].copy_from_slice(&9999u16.to_be_bytes());
        f[46] = 5 << 4;
        f[47] = 0x18;
        f.extend_from_slice(payload);
        // Reference TCP checksum: over the pseudo-header and the segment.
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&f[26..34]);
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
        let mut all = pseudo.clone();
        all.extend_from_slice(&f[34..]);
        let tsum = checksum(&all);
        f[50..52].copy_from_slice(&tsum.to_be_bytes());
        f
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(add(0, &d)), 0xddf2);
        assert_eq!(checksum(&d), !0xddf2);
        // Odd length and any split give the same sum.
        let e = [1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
        assert_eq!(fold(add(0, &e)), fold(add(add(0, &e[..4]), &e[4..])));
    }

    #[test]
    fn a_valid_segment_sums_to_zero() {
        let f = tcp4_frame(b"hello, world, this is the payload");
        let mut all = Vec::new();
        all.extend_from_slice(&f[26..34]);
        all.extend_from_slice(&[0, 6]);
        all.extend_from_slice(&((f.len() - 34) as u16).to_be_bytes());
        all.extend_from_slice(&f[34..]);
        assert_eq!(checksum(&all), 0);
        assert_eq!(checksum(&f[14..34]), 0);
    }

    #[test]
    fn offload_then_completion_gives_the_real_checksum() {
        for len in [0usize, 1, 2, 7, 100, 1448, 3001] {
            let payload: Vec<u8> = (0..len).map(|i| ((i * 131 + 7) % 251) as u8).collect();
            let good = tcp4_frame(&payload);
            let mut f = good.clone();
            f[50..52].fill(0);
            let o = prepare_tcp_offload(&mut f).unwrap();
            assert_eq!(o, TcpOffload { ipv6: false, csum_start: 34, hdr_len: 54 });
            // What a device does with NEEDS_CSUM: finish it.
            assert!(complete_partial(&mut f, o.csum_start, TCP_CSUM_OFFSET));
            assert_eq!(f, good, "payload {len}");
        }
    }

    #[test]
    fn not_tcp_is_left_alone() {
        let mut f = tcp4_frame(b"x");
        f[23] = 17;
        let before = f.clone();
        assert_eq!(prepare_tcp_offload(&mut f), None);
        assert_eq!(f, before);
        let mut arp = vec![0u8; 42];
        arp[12] = 0x08;
        arp[13] = 0x06;
        assert_eq!(prepare_tcp_offload(&mut arp), None);
        assert_eq!(prepare_tcp_offload(&mut [0u8; 20]), None);
        assert!(!complete_partial(&mut [0u8; 10], 9, 16));
    }

    #[test]
    fn ipv6_offsets() {
        let mut f = vec![0u8; 14 + 40 + 20];
        f[12] = 0x86;
        f[13] = 0xdd;
        f[14] = 0x60;
        f[18..20].copy_from_slice(&20u16.to_be_bytes());
        f[20] = 6;
        f[14 + 40 + 12] = 5 << 4;
        let o = prepare_tcp_offload(&mut f).unwrap();
        assert_eq!(o, TcpOffload { ipv6: true, csum_start: 54, hdr_len: 74 });
        // Addresses all zero: the pseudo-header is protocol + length.
        assert_eq!(u16::from_be_bytes([f[70], f[71]]), 6 + 20);
    }
}
