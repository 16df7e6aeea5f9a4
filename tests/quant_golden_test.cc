// Golden vectors: the bytes ggml's reference quantizers (quantize_row_*_ref,
// reached through ggml_quantize_chunk with no importance matrix, as
// llama-quantize does) produce for GoldenInput(), recorded from ggml commit
// d99724f (2026-08) built for x86-64 (Q5_1 from llama.cpp 82bb485's ggml). tandem's quantizers must match them bit
// for bit, so the files tandem-quantize writes are the files llama-quantize
// writes; decoding them must land close to the input.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/quant/ggml_type.h"
#include "common/quant/quantize.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

// 512 values (two K-quant super-blocks, sixteen 32-value blocks) from a
// fixed LCG: sums of uniforms, every 37th value a 6x outlier, one all-zero
// 32-value block and an all-positive 16-value run.
std::vector<float> GoldenInput() {
  std::vector<float> x(512);
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) * (1.0f / 16777216.0f);
  };
  for (size_t i = 0; i < x.size(); ++i) {
    float v = (next() + next() + next() - 1.5f) * 0.05f;
    if (i % 37 == 0) v *= 6.0f;
    if (i >= 448 && i < 480) v = 0.0f;
    if (i >= 96 && i < 112) v = std::abs(v) + 0.01f;
    x[i] = v;
  }
  return x;
}

struct Golden {
  GgmlType type;
  const char* hex;
};

constexpr Golden kGolden[] = {
    {GgmlType::kQ8_0,
     "73188104030206071402fdf7ef08f7070a08000df70d0df90aee0f000c0e0a05fc01510f20b63d050d0670a5c54f4b01"
     "1b2aee14f6f9ea06089da43cc881c9ea03b5ab07e213fe01f724fced150f09f87f1a2ff605f20810f1fd03f8fadaf7fd"
     "1907f0eaf60b011815140d050d120c120d0c1116150c0a7f080f060ff5f400f20df40802fdeb0c0b490de9cc011b2b08"
     "c8977fda36f894124efff2d5004102037948f19315c47f18c7befc141efff01102db1918db1408eb01eb2522f1190a00"
     "28121505007f06e8180a013555180bf4f302040e03f4030511fffa060e0f04ecfe00f30309f508fdfbfa00fd7f03dc0d"
     "3e35c2604cd9c0583f815560b7f796d21d1fca8cd6d5371a7ec1d03cd5a0eb3e5d1706f8f67f0700041804171710fffe"
     "1bfff4f7f6f0ebe211feee060effe7f1fef303180810021afb0105f47ff50deafc0607f2010a1812e5fdff00fa0206f2"
     "f3e511f31213d90af8d3faf4f4d3ed00f7e51a8104fde2d00809fbf512fcfbee01e6f7d5f80f1b15fd131ee5f0e801ff"
     "e8e1e5edfff4f503fafa7f00f1e410f2000a04ef00eb241c1715f7ef05e4090b22040afa17e810f12ae7040904ec1f02"
     "fc81f8e52512efec13ed870fd73701b42c00152607022616c6337fa6179b320f30993696dd990cda02f7e8ac00000000"
     "000000000000000000000000000000000000000000000000000000000000e8180a811408f5fa0dfd0bfaf6f30e09fd03"
     "f3060c15fd00fefa0e0314f001edf112"},
    {GgmlType::kQ4_0,
     "6a2880987898988899789887979897888989421f7a837c8889282fc2440d5d788a3b3789d2a378789986888987a79789"
     "608695999879f2a7877787789797879777977787879777703e9d99bb884685870c3f90fa75c90f77c3c8f2a496687987"
     "587a76868a0787a9787986564ca887998988988778998888878888880787d01dacab541e5d56b4aefc405dce532771c5"
     "4ea79899999098a8788698877787a8988698f5a788776876a88888898089879998a87899042366598895887797858778"
     "87667a50789811a58887068a99a978988a7a8a99889969680d2587978876a9898a088968a99779779b76789f7be5587d"
     "55e857f6a8e876a78c95a0de008088888888888888888888888888888888de2879809999878889889988977789797898"},
    {GgmlType::kQ4_1,
     "70256ab4d0edcdedeeceefbdeddcebeeecdedede481f42ab7a837c8889282fc2440d4d788a3b37896c21b1a843542337"
     "4332350534336f4628133442f12446a93444334313142314331334242403333f301d7ca8654477b97a77f3c06f048a36"
     "f0883c37d422d3a9266342357450564630f5441163414787502571a92301212212233211322324122123f3242c1ed0a9"
     "9b9b441d5c55b49dfb405dbd532761b5d124ebaa2322221f1403533513354534131335232825daaa3344534502233331"
     "2f32341112034311842004afa98ddcd8ccbbebc8cbbcdcaacf80cdecbb22f8a82325f630110143233140301133126263"
     "26230db1cbcacca9ecbcbe0cbc9bfdd9ad9adfa9521f42aa840aa782aa07a80957078948736a5f110000000000000000"
     "0000000000000000000000001126deb4bed0effedcdcdecdeedcfcbcdebebdfd"},
    {GgmlType::kQ5_0,
     "6a24fee95bff0020f02021f112e0200f2e211f110101421b7dbe9890f4f7d81112414e84990a99d003755e13d29f37a2"
     "fc73f0e0210c01121d5e1f01d0fd2a311ff2f2a30000f03afdedfeef1e2e0f2eee2efe0d0d3feff03e99c79a37cb2357"
     "008d0b0f177d20e5d9810ede7680f2a0363909492cd0f20eb0e5ddfd050dff33d0f30b9c4ca4ce19bfbe0f3102002f0e"
     "f011f00f1e10010f0e0ed0199b0dc3894847981cbabb783bf880ab8cb74fd38a4ea326b0bff92f1111203f40ef0d2ffd"
     "ed0e30200d20f5a3b49af1bb0ffed0ed31000f021001fe23203fef22041f02d24c84cba11f1afffe2ffafee00fddf3b0"
     "f12011a1f9ffbb3d101e0c032243e02003f403220032c1c00d21f455774c0f1e01dc41010401f1df532de2de25ed789b"
     "2d92a2fbd5d9a0eaabd09ddb4fd0eb5d071a30bb0080ffffffff00000000000000000000000000000000de24cdf17e97"
     "e11013310f0f02f0210f3fee02e1e020"},
    {GgmlType::kQ5_1,
     "43216ab4feffffffb0ec9cebec9cdf7beab9d7ecd9ccadbd0c1b42ab7dbe9a90f507e81122415f85990b9ae114765e13"
     "3f1db1a80014000097a7457e86646b0a6976cf9c40355895c82046a9008000006989678627284718772768594907767f"
     "05197ca81865c834cb97ee72e4ffe780cf09156df011796e9c1ed3a9000000824dc7947af7a0bc8c70fb8933c7937e1d"
     "242171a9000000405602414525576522654538344345f757f919d0a99b0dc3893736981ba9ab683af780aa7ba74fd37a"
     "aa20ebaa080000004744443f2706976b277a9b6916356b36fe20daaa000100006779a69b045657534f63783135079733"
     "5e1c04afffdfffff420cb8c19987d791966aa8548f108bd9831ef8a800000400565afc6133119636618071326624d4c7"
     "eb1e0db1ffff7fff86948842d9897e086926ecb34a45bf43151b42aad26c5d0419155e04440e5103af0e0391e6d5bf32"
     "000000000000000000000000000000000000000000000000df21deb4fdffffff8dc0dffca8a9ad9aedb9f878bd7c7aeb"},
    {GgmlType::kQ4_K,
     "930d7a1c3f96df7d3f0d090a8fa9bea2a03dbd8d8d8eef2d4dcccb8e9cae7e9e7d7e6c8e8e2c2ebb4e0d4e6e8e3d3c8d"
     "444433373342364535334f46483334e234453243141323103314362422023335653427593a0753500f544a1630186c67"
     "2654473b77575f4b36e048135f483383b3a141d3c35433c1b303c4d232731444939042025153a391e33242b252226fb3"
     "1b0ef01cb77517e38c0a17c815a300ff3342325e23333315f31545042333351332325241012024232133341311014312"
     "395e6c081c1c3c381b0d0c1a3f202d3d2a28fe3e1c0c4f2d3c4b3d1a3c196c6e4baa7c29ac7d8f9c7c7b9e893daaff19"
     "8c0cac8aae0cab005b098f4d7a6a5d1ae000f0e0c0c0e0d0e0c0c0c0e0e0d0d0c0e0e0f0d0d0d0c0e0d0f0b0d0b0b0f0"},
    {GgmlType::kQ5_K,
     "62097c1c3f95df793f0d080a8fa7ada28281039393030381910397830713110b818301130301919381211181131141a3"
     "507b8b1b2c1cff5b9ab9a71c496ced3cfb0de91d2d495d879e0b9dee1d7c5a1b9797756e76937b8a79758f9c907578f4"
     "688a64862725562075266c5844037579db774ea2740fc7b00fb9853d7031e8de4cc99e77eeafbe887cf08126bf917716"
     "675272a585a77592650598a463e6279825308414a2a55622e6749363a434cf65e009f41cb37718e48b0c17c816a300ff"
     "94349495b494b4b49694b4b494b0b494b494bcb4b494b4849494b49494949494779464bf5766774bf74a8a2956757b36"
     "6384b49302506966526779363113963352acc81139176861160a18256f404b795450fb6c39189d3969867a356821d8bd"
     "9664e84249e91e38f9e63c136a55ff23181958045d085700a6030e9be4d4bb34d000f0d090a0e0a0d0a09080e0d0a0c0"
     "80c0d0f0a0b0b0a0e0c0f080b07080f0"},
    {GgmlType::kQ6_K,
     "000121701152b5c1ef2e0ca24e32f33261d541e626a3c22199e0346831e88a82b7b5deffdcced0cad1d9cab0b8d4e51a"
     "bd6e9b6102e709bf32e0c23ab11d2a02c65d80c9857ebe6aa07a1222bb6c7c40f45b100030ffe13ee41b1b2f001a0ef1"
     "0adf028f326006650001678ed1ee5f4d948aeed0b6bc2b9f0001ce16ba8e5003646e62566666525e5d61415a55665a26"
     "a6e795db6b119308d712b7a75b02d1eaceb676d9d9415effd01ec9e22b510c4e5a66a6e9a69554641ae3a56aa4e58a57"
     "80ed17e639ee77ec1313eb4a117deb156a847f22e350fed0df5abf0aeaac601119f0c307566fca91c2dedd471effa730"
     "aea3de3cf04af1801ff371035dc5f13f5e33112c0c05407ccf3009d2f74001517390070d0d050a08070d09040f01040b"
     "01030102010b08000f000e0909040c0b050b2a125023d5e03bf63ef0e7da3f23f0164782ff045e013090b6b12475f1cd"
     "696755e6da14191a9559112915196a46659a89892dac90946799945a6a8594815d658a06898f45498445854a44478986"
     "408fca420a098a828d8005410ac649c5c6015de969ead2eff04116c018ec000080150685"},
};

TEST(QuantGoldenTest, QuantizersMatchGgmlBitForBit) {
  const std::vector<float> x = GoldenInput();
  for (const Golden& golden : kGolden) {
    SCOPED_TRACE(GgmlTypeName(golden.type));
    const std::string want = absl::HexStringToBytes(golden.hex);
    ASSERT_EQ(want.size(), *GgmlRowBytes(golden.type, 512));
    std::vector<uint8_t> got(want.size());
    ASSERT_OK(QuantizeRow(golden.type, x, absl::MakeSpan(got)));
    const size_t block_bytes = GgmlBlockBytes(golden.type);
    for (size_t b = 0; b < got.size() / block_bytes; ++b) {
      EXPECT_EQ(absl::BytesToHexString(
                    absl::string_view(reinterpret_cast<const char*>(got.data()) + b * block_bytes, block_bytes)),
                absl::BytesToHexString(want.substr(b * block_bytes, block_bytes)))
          << "block " << b;
    }
  }
}

TEST(QuantGoldenTest, GoldenBytesDecodeCloseToTheInput) {
  const std::vector<float> x = GoldenInput();
  for (const Golden& golden : kGolden) {
    SCOPED_TRACE(GgmlTypeName(golden.type));
    const std::string bytes = absl::HexStringToBytes(golden.hex);
    std::vector<float> y(512);
    ASSERT_OK(DequantizeRow(golden.type,
                            absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                            absl::MakeSpan(y)));
    double err = 0, sig = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      sig += double(x[i]) * x[i];
    }
    EXPECT_LT(std::sqrt(err / sig), 0.2);  // outliers every 37 values make this data hard for 4 bits
    for (size_t i = 448; i < 480; ++i) EXPECT_EQ(y[i], 0.0f) << i;  // the zero block stays zero
  }
}

// The types tandem reads but does not write: the bytes ggml's reference
// quantizers give GoldenInput() (recorded from llama.cpp 82bb485's ggml,
// x86-64), and the FNV-1a 64 hash of the f32 bits its dequantizers
// (dequantize_row_*) give for them. tandem decodes those bytes to the same
// bits.
struct DecodeGolden {
  GgmlType type;
  uint64_t fnv;
  const char* hex;
};

constexpr DecodeGolden kDecodeGolden[] = {
    {GgmlType::kQ3_K, 0xec999a91b97a3e09ULL,
     "b4f75dabaf1739f78f3da0d3718d2f357f5ff8efd7d0496279d5ed7dc3e1b85fcccc083000d031cc0804c7f0ec0c040c"
     "50e36ec383b73648bb80ba1fe219b7909db2b8fbf3d0bafbb039c6c8933b1e8cc0dd80c24c4c8cc2008383864cc3428a"
     "505ba6294efcbd5ba8e55eb56998bb1fbfb087a78f9aa5b68693af9386bfba1a362ebc9abf8f1c0b3f99a8a893043080"
     "c07c80800033404343b410d0c30012071f1a017022000e2106683942f8da050a400a0f030d0c03000e0e0b09000ec4c0"
     "8807490008404cc301cd03c3cd0768fa6aba010c0b51a785279ddd98"},
    {GgmlType::kQ2_K, 0x7c09c2fb187203e0ULL,
     "ff2223331522092223233327121a232308020a160a061e12120e3a561a0a06caeafbd9eb6b61a70ce762f7ab9b17d6fa"
     "ad8945de9a711d8c932dbad508663e7d8185450645458786c54c468147067589d120b624283329335322221612862322"
     "0000ff23a5f4f0277170b5a13d313561b04475b0190ded2d21187b2a295a2b1625016e758408858089868b8986858a88"
     "82888f800b838fca4f434f408682cb074a0a07c262213125"},
    {GgmlType::kIQ4_NL, 0x20c0b19060a7a697ULL,
     "73188098789898799a689887969997898989e80e7b726d8899181fd1330e3e688a2b269ae19378789985889986b79789"
     "607694a99779019876767777979687967797768686a77770208d9abc883684870c2f90fb64d90f66c2d8ff9495687986"
     "586b66768b0677aa687a8545de188967878878899877888889788788f989350eacac431e5d55c3aefc304ece532761c4"
     "5e9797999990a7a8688698767687a898869882188999a89a688888877f878976786898770a1355499794777797847668"
     "87667a4078981c958886058a99aa78988a7a8a9a88a95968181587968866a9898b087967ba966967ab661a8f6bf3487e"
     "44f846f5b7f875b68d94a0ee000088888888888888888888888888888888e71879809aa9878789789987a77789697898"},
    {GgmlType::kIQ4_XS, 0x9f971a805d12b9cbULL,
     "de84e44ea3ad04b08098789898799a6898879699978989897b726d8899182fc2430d4d688a2b269a78789985889986b7"
     "9789607694a9977976767777979687967797768686a777709acc883584870c2f90fb63d90f66d2d895687986586b6676"
     "8b0677aa687a85458967878878899877888889788788f989acac431e5d55c3aefd304ece532761c4e784d32838156f00"
     "97999990a7a8688698767687a89886988999a89a688888877f878976786898775549979477779784766887667a407898"
     "8886058a99aa78988a7a8a9a88a9596887968866a9898b087967ba9669679b666bf4487d44f846f5b7f875b68c94a0ee"
     "8888888888888888888888888888888879809aa9878789789987a77789697898"},
};

uint64_t Fnv1a64(const std::vector<float>& values) {
  uint64_t h = 1469598103934665603ULL;
  for (float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    for (int k = 0; k < 4; ++k) {
      h ^= (bits >> (8 * k)) & 0xff;
      h *= 1099511628211ULL;
    }
  }
  return h;
}

TEST(QuantGoldenTest, ReadOnlyTypesDecodeAsGgmlBitForBit) {
  const std::vector<float> x = GoldenInput();
  for (const DecodeGolden& golden : kDecodeGolden) {
    SCOPED_TRACE(GgmlTypeName(golden.type));
    const std::string bytes = absl::HexStringToBytes(golden.hex);
    ASSERT_EQ(bytes.size(), *GgmlRowBytes(golden.type, 512));
    std::vector<float> y(512);
    ASSERT_OK(DequantizeRow(golden.type,
                            absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                            absl::MakeSpan(y)));
    EXPECT_EQ(Fnv1a64(y), golden.fnv);
    double err = 0, sig = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      sig += double(x[i]) * x[i];
    }
    EXPECT_LT(std::sqrt(err / sig), 0.4);  // 2 and 3 bits on outlier-laden data
  }
}

}  // namespace
}  // namespace tandem
